import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from tensordict.nn import (
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from torch import nn
from torchrl.modules import GRUModule, set_recurrent_mode
from torchrl.objectives import ClipPPOLoss

from torchrl_seqchunk import RecurrentPPOLoss, ResetRNN, make_windows, slot_weights

OBS, HIDDEN, ACTIONS = 3, 5, 3
MEMORY = ["actor_state", "critic_state"]


class StoredMemoryGRU(TensorDictModuleBase):
    """A minimal module honouring the window contract: memory := stored memory where is_first."""

    def __init__(self, cell, *, out_key, state_key, is_first_key):
        super().__init__()
        self.cell = cell
        self.in_keys = ["obs", is_first_key, state_key]
        self.out_keys = [out_key]

    def forward(self, td):
        x, is_first, stored = (td.get(key) for key in self.in_keys)
        h, out = torch.zeros_like(stored[:, 0]), []
        for t in range(td.shape[-1]):
            h = self.cell(x[:, t], torch.where(is_first[:, t], stored[:, t], h))
            out.append(h)
        td.set(self.out_keys[0], torch.stack(out, 1))
        return td


def make_agent(backbone, is_first_key="is_first"):
    """Actor and critic with their own GRUCell memory ("actor_state", "critic_state")."""
    cells = {name: nn.GRUCell(OBS, HIDDEN) for name in ("actor", "critic")}

    def recurrent(name):
        if backbone == "GRUModule":  # TorchRL's own, unchanged: restarts from the stored state at is_init
            gru = nn.GRU(OBS, HIDDEN, batch_first=True)
            for part in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                setattr(gru, f"{part}_l0", getattr(cells[name], part))  # the cell's own parameters
            return GRUModule(gru=gru, in_keys=["obs", f"{name}_state", "is_init"],
                             out_keys=[f"{name}_h", ("next", f"{name}_state")])
        if backbone == "ResetRNN":
            return ResetRNN(
                cells[name], in_key="obs", out_key=f"{name}_h", state_key=f"{name}_state",
                reset_state_key=f"{name}_state", carry=False, is_first_key=is_first_key,
            )
        return StoredMemoryGRU(
            cells[name], out_key=f"{name}_h", state_key=f"{name}_state", is_first_key=is_first_key
        )

    heads = {"actor": nn.Linear(HIDDEN, ACTIONS), "critic": nn.Linear(HIDDEN, 1)}
    actor = ProbabilisticTensorDictSequential(
        recurrent("actor"),
        TensorDictModule(heads["actor"], ["actor_h"], ["logits"]),
        ProbabilisticTensorDictModule(
            ["logits"], ["action"], distribution_class=torch.distributions.Categorical,
            return_log_prob=True,
        ),
    )
    critic = TensorDictSequential(
        recurrent("critic"), TensorDictModule(heads["critic"], ["critic_h"], ["state_value"])
    )
    return actor, critic, cells, heads


def make_rollout(lengths_per_row, *, advantage=None, seed=0):
    """[num_envs, T] rollout; row e concatenates episodes of the given lengths."""
    gen = torch.Generator().manual_seed(seed)
    num_envs, steps = len(lengths_per_row), sum(lengths_per_row[0])
    done = torch.zeros(num_envs, steps, 1, dtype=torch.bool)
    for e, lengths in enumerate(lengths_per_row):
        done[e, torch.tensor(lengths).cumsum(0) - 1] = True
    if advantage is None:
        advantage = torch.randn(num_envs, steps, 1, generator=gen)
    return TensorDict(
        {
            "step": torch.arange(num_envs * steps).view(num_envs, steps),
            "obs": torch.randn(num_envs, steps, OBS, generator=gen),
            "action": torch.randint(ACTIONS, (num_envs, steps), generator=gen),
            "action_log_prob": -1.1 + 0.3 * torch.randn(num_envs, steps, generator=gen),
            "actor_state": torch.randn(num_envs, steps, HIDDEN, generator=gen),
            "critic_state": torch.randn(num_envs, steps, HIDDEN, generator=gen),
            "advantage": advantage,
            "value_target": torch.randn(num_envs, steps, 1, generator=gen),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
        },
        batch_size=[num_envs, steps],
    )


def reference_slots(rollout, window, cells, heads, *, clip=0.2, entropy_coeff=0.01):
    """Independent per-step loop over every window of every row, in make_windows' order.

    Memory starts from the stored value and is set back to the stored value after
    every done step. Returns per-slot terms [N, W] plus the mask and count bookkeeping.
    """
    num_envs, steps = rollout.batch_size
    done = rollout["next", "done"].squeeze(-1)
    count = torch.zeros(steps)
    for start in range(steps - window + 1):
        count[start:start + window] += 1
    rows = {key: [] for key in ("log_prob", "objective", "entropy", "critic", "kept", "weight")}
    for e in range(num_envs):
        for start in range(steps - window + 1):
            slot = {key: [] for key in rows}
            kept = True
            for t in range(start, start + window):
                if t == start or done[e, t - 1]:
                    h_actor = rollout["actor_state"][e, t]
                    h_critic = rollout["critic_state"][e, t]
                    kept = kept and t == start
                obs = rollout["obs"][e, t].unsqueeze(0)
                h_actor = cells["actor"](obs, h_actor.unsqueeze(0)).squeeze(0)
                h_critic = cells["critic"](obs, h_critic.unsqueeze(0)).squeeze(0)
                dist = torch.distributions.Categorical(logits=heads["actor"](h_actor))
                log_prob = dist.log_prob(rollout["action"][e, t])
                ratio = (log_prob - rollout["action_log_prob"][e, t]).exp()
                adv = rollout["advantage"][e, t, 0]
                slot["log_prob"].append(log_prob)
                slot["objective"].append(-torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv))
                slot["entropy"].append(-entropy_coeff * dist.entropy())
                slot["critic"].append(
                    F.smooth_l1_loss(heads["critic"](h_critic)[0], rollout["value_target"][e, t, 0])
                )
                slot["kept"].append(kept)
                slot["weight"].append(1.0 / count[t])
            for key in rows:
                rows[key].append(torch.stack(slot[key]) if key != "kept" else torch.tensor(slot[key]))
    return {key: torch.stack(value) for key, value in rows.items()}


def reduce_reference(ref, mode):
    terms = {name: ref[name] for name in ("objective", "critic", "entropy")}
    if mode == "reset_continue":
        return {name: value.mean() for name, value in terms.items()}
    if mode == "mask":
        return {name: (value * ref["kept"]).sum() / value.numel() for name, value in terms.items()}
    w = ref["weight"]
    return {name: (value * w).sum() / w.sum() for name, value in terms.items()}


@pytest.mark.parametrize("backbone", ["contract", "ResetRNN", "GRUModule"])
@pytest.mark.parametrize("mode", ["reset_continue", "mask", "inverse_count"])
def test_matches_per_step_reference(backbone, mode):
    """Also TorchRL's GRUModule as it is: its recurrent mode on make_windows' is_init is reset_continue."""
    actor, critic, cells, heads = make_agent(backbone)
    rollout = make_rollout([[3, 5, 4], [6, 2, 4]])
    stored = rollout.clone()
    if backbone == "GRUModule":  # TorchRL's state layout: [*batch, num_layers, H]
        for key in MEMORY:
            stored[key] = stored[key].unsqueeze(-2)
    windows = make_windows(stored, 4, memory_key=MEMORY)
    loss = RecurrentPPOLoss(actor, critic, boundary_mode=mode)
    params = [p for module in (*cells.values(), *heads.values()) for p in module.parameters()]

    ref = reference_slots(rollout, 4, cells, heads)
    expected = reduce_reference(ref, mode)
    out = loss(windows)

    with set_recurrent_mode(True):
        log_prob = actor.get_dist(windows.clone()).log_prob(windows["action"])
    torch.testing.assert_close(log_prob, ref["log_prob"], atol=1e-5, rtol=1e-5)
    for name, value in expected.items():
        torch.testing.assert_close(out[f"loss_{name}"], value, atol=1e-5, rtol=1e-5)
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    grads = torch.autograd.grad(total, params)
    ref_grads = torch.autograd.grad(sum(expected.values()), params)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-5)
    real = ref["kept"] if mode == "mask" else torch.ones_like(ref["kept"])
    assert out["real_slots"].item() == real.sum().item()
    torch.testing.assert_close(out["real_mean_objective"], ref["objective"][real].mean())
    torch.testing.assert_close(out["mean_count_weight"], ref["weight"][real].mean())


def test_stored_memory_stops_gradient_at_boundaries():
    actor, critic, cells, heads = make_agent("ResetRNN")
    windows = make_windows(make_rollout([[2, 4]]), 6, memory_key=MEMORY)
    windows["obs"].requires_grad_(True)
    loss = RecurrentPPOLoss(actor, critic, entropy_bonus=False, critic_coeff=0.0)
    out = loss(windows)
    (obs_grad,) = torch.autograd.grad(out["loss_objective"], windows["obs"])
    # perturbing the first episode's inputs cannot change the second episode's terms
    per_slot = RecurrentPPOLoss(actor, critic, reduction="none", entropy_bonus=False, critic_coeff=0.0)
    second = per_slot(windows)["loss_objective"][0, 2:].sum()
    (second_grad,) = torch.autograd.grad(second, windows["obs"])
    assert obs_grad[0, :2].abs().sum() > 0
    assert second_grad[0, :2].abs().sum() == 0


def with_current_log_prob(windows, actor):
    """Stores the current policy's log-probs, so that every ratio is exactly 1."""
    with torch.no_grad():
        windows["action_log_prob"] = actor.get_dist(windows.clone()).log_prob(windows["action"])
    return windows


def contributions(mode, lengths, window):
    """Per step of the rollout: number of windows where it trains, and its total weight."""
    actor, critic, _, _ = make_agent("contract")
    rollout = make_rollout([lengths], advantage=torch.ones(1, sum(lengths), 1))
    windows = with_current_log_prob(make_windows(rollout, window, memory_key=MEMORY), actor)
    loss = RecurrentPPOLoss(
        actor, critic, boundary_mode=mode, reduction="none", entropy_bonus=False
    )
    per_slot = -loss(windows)["loss_objective"]  # weight of each slot (advantage 1, ratio 1)
    steps = windows["step"].reshape(-1)
    count = torch.zeros(sum(lengths)).index_add_(0, steps, (per_slot != 0).float().reshape(-1))
    total = torch.zeros(sum(lengths)).index_add_(0, steps, per_slot.reshape(-1).detach())
    return count.long().tolist(), total


def test_counts_per_step():
    lengths, window = [5, 7, 4], 4
    within_k = [k for length in lengths for k in range(length)]
    mask_count, _ = contributions("mask", lengths, window)
    assert mask_count == [1, 2, 3, 4, 4, 1, 2, 3, 4, 4, 4, 4, 1, 1, 1, 1]
    # min(k + 1, W) away from the rollout end (the last W - 1 steps lie in fewer windows)
    assert mask_count[:-3] == [min(k + 1, window) for k in within_k][:-3]
    continue_count, continue_total = contributions("reset_continue", lengths, window)
    assert continue_count == [1, 2, 3] + [4] * 10 + [3, 2, 1]
    assert continue_total.tolist() == continue_count
    inverse_count, inverse_total = contributions("inverse_count", lengths, window)
    assert inverse_count == continue_count
    torch.testing.assert_close(inverse_total, torch.ones(16))


@pytest.mark.parametrize("seed", range(4))
def test_counts_on_random_episodes(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (6,), generator=gen).tolist()
    steps = sum(lengths)
    window = int(torch.randint(1, min(steps, 6) + 1, (1,), generator=gen))
    starts = range(steps - window + 1)
    episode_start = [sum(lengths[:i]) for i, length in enumerate(lengths) for _ in range(length)]
    holding = [[s for s in starts if s <= j < s + window] for j in range(steps)]
    expected_mask = [sum(s >= episode_start[j] for s in holding[j]) for j in range(steps)]
    assert contributions("mask", lengths, window)[0] == expected_mask
    assert contributions("reset_continue", lengths, window)[0] == [len(h) for h in holding]


def policy_losses(mode, lengths, advantage):
    actor, critic, _, _ = make_agent("contract")
    rollout = make_rollout([lengths, lengths], advantage=advantage)
    windows = with_current_log_prob(make_windows(rollout, 4, memory_key=MEMORY), actor)
    out = RecurrentPPOLoss(actor, critic, boundary_mode=mode)(windows)
    return out["loss_objective"].item(), out["real_mean_objective"].item()


def test_policy_loss_does_not_scale_with_episode_length():
    # same per-step advantages, episodes of length 3 vs 12
    advantage = torch.randn(2, 24, 1)
    short = policy_losses("reset_continue", [3] * 8, advantage)
    long = policy_losses("reset_continue", [12] * 2, advantage)
    assert short == pytest.approx(long, abs=1e-6)
    # the mask baseline with advantage 1: kept slots / all slots, by hand
    # length 3: windows keep 3, 2, 1 slots in turn (42 of 84 per row); length 12: 78 of 84
    ones = torch.ones(2, 24, 1)
    assert policy_losses("mask", [3] * 8, ones)[0] == pytest.approx(-0.5)
    assert policy_losses("mask", [12] * 2, ones)[0] == pytest.approx(-78 / 84)
    assert policy_losses("reset_continue", [3] * 8, ones)[0] == pytest.approx(-1.0)
    assert policy_losses("reset_continue", [12] * 2, ones)[0] == pytest.approx(-1.0)
    # averaged over real slots only, every mode logs the same value
    for mode in ("mask", "inverse_count"):
        for lengths in ([3] * 8, [12] * 2):
            assert policy_losses(mode, lengths, ones)[1] == pytest.approx(-1.0)


def test_torchrl_options_still_work():
    actor, critic, cells, heads = make_agent("contract")
    rollout = make_rollout([[3, 5, 4]])
    windows = make_windows(rollout, 4, memory_key=MEMORY)
    windows["state_value"] = torch.randn(9, 4, 1)
    ref = reference_slots(rollout, 4, cells, heads, clip=0.1, entropy_coeff=0.05)
    loss = RecurrentPPOLoss(
        actor, critic, reduction="sum", clip_epsilon=0.1, entropy_coeff=0.05,
        critic_coeff=0.5, clip_value=0.3,
    )
    out = loss(windows)
    torch.testing.assert_close(out["loss_objective"], ref["objective"].sum(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["loss_entropy"], ref["entropy"].sum(), atol=1e-5, rtol=1e-5)
    assert "value_clip_fraction" in out.keys()
    assert set(loss.out_keys) >= {"loss_critic", "real_slots", "real_mean_critic", "mean_count_weight"}
    assert {"is_first", "count_weight"} <= set(loss.in_keys)



@pytest.mark.parametrize("window", [4, 1])  # some slots dropped; every slot trains (one estimator for both)
def test_normalize_advantage_standardizes_over_the_slots_that_train(window):
    """normalize_advantage in mask mode: the advantage standardized by hand over the trained
    slots alone (as sb3-contrib's RecurrentPPO leaves out its padding), then the same loss
    without normalization; the slots dropped after a reset take no part in the statistics."""
    mode = "mask"
    actor, critic, _, _ = make_agent("ResetRNN")
    windows = make_windows(make_rollout([[3, 5, 4], [6, 2, 4]], seed=3), window, memory_key=MEMORY)
    windows["advantage"] = windows["advantage"] * 3.0 + 1.0
    trained = slot_weights(windows["is_first"], windows["count_weight"], mode) > 0
    assert trained.all() == (window == 1)
    adv = windows["advantage"].squeeze(-1)
    loc = adv[trained].mean()
    by_hand = windows.clone()
    by_hand["advantage"] = ((adv - loc) / (adv[trained] - loc).pow(2).mean().sqrt()).unsqueeze(-1)
    expected = RecurrentPPOLoss(actor, critic, boundary_mode=mode, normalize_advantage=False)(by_hand)
    out = RecurrentPPOLoss(actor, critic, boundary_mode=mode, normalize_advantage=True)(windows.clone())
    torch.testing.assert_close(out["loss_objective"], expected["loss_objective"], atol=1e-6, rtol=1e-5)
    assert "shifted_valid" not in windows.keys()  # the input is left as it was


def test_custom_keys():
    actor, critic, cells, heads = make_agent("ResetRNN", is_first_key="is_init")
    rollout = make_rollout([[3, 5, 4]])
    windows = make_windows(
        rollout, 4, memory_key=MEMORY, is_first_key="is_init", count_weight_key=("w", "count")
    )
    loss = RecurrentPPOLoss(
        actor, critic, boundary_mode="inverse_count", is_first_key="is_init",
        count_weight_key=("w", "count"),
    )
    expected = reduce_reference(reference_slots(rollout, 4, cells, heads), "inverse_count")
    torch.testing.assert_close(loss(windows)["loss_objective"], expected["objective"], atol=1e-5, rtol=1e-5)


def test_bad_input():
    actor, critic, _, _ = make_agent("contract")
    windows = make_windows(make_rollout([[3, 5]]), 4, memory_key=MEMORY)
    with pytest.raises(ValueError, match="boundary_mode must be one of.*'masked'"):
        RecurrentPPOLoss(actor, critic, boundary_mode="masked")
    loss = RecurrentPPOLoss(actor, critic)
    with pytest.raises(ValueError, match="advantage_key='advantage' is not in the windows; run boundary_gae"):
        loss(windows.exclude("advantage"))
    with pytest.raises(ValueError, match="count_weight_key='count_weight' is not in the windows"):
        loss(windows.exclude("count_weight"))
    with pytest.raises(ValueError, match=r"batch_size=\(20,\).*expects windows \[N, W\]"):
        loss(windows.reshape(-1))
    # a ResetRNN that resets to zeros (no reset_state_key) or reads another reset flag would
    # silently start every window from the wrong memory
    cell = nn.GRUCell(OBS, HIDDEN)
    zeros_at_reset = TensorDictSequential(
        ResetRNN(cell, in_key="obs", out_key="critic_h", state_key="critic_state", carry=False),
        TensorDictModule(nn.Linear(HIDDEN, 1), ["critic_h"], ["state_value"]),
    )
    with pytest.raises(ValueError, match="reset_state_key"):
        RecurrentPPOLoss(actor, zeros_at_reset)
    other_flag = TensorDictSequential(
        ResetRNN(cell, in_key="obs", out_key="critic_h", state_key="critic_state",
                 reset_state_key="critic_state", is_first_key="is_init", carry=False),
        TensorDictModule(nn.Linear(HIDDEN, 1), ["critic_h"], ["state_value"]),
    )
    with pytest.raises(ValueError, match="is_first_key='is_init'"):
        RecurrentPPOLoss(actor, other_flag)
    learned = TensorDictSequential(  # every reset in a window reads the stored memory: no gradient
        ResetRNN(cell, in_key="obs", out_key="critic_h", state_key="critic_state",
                 reset_state_key="critic_state", initial_state="learned", carry=False),
        TensorDictModule(nn.Linear(HIDDEN, 1), ["critic_h"], ["state_value"]),
    )
    with pytest.raises(ValueError, match="initial_state='learned'.*never be trained"):
        RecurrentPPOLoss(actor, learned)
    # a window not flagged at slot 0 would start from zeros (or a stale carry), not its memory
    unflagged = windows.clone()
    unflagged["is_first"][3, 0] = False
    with pytest.raises(ValueError, match=r"slot 0 .* window 3"):
        loss(unflagged)
    float_flags = windows.clone()
    float_flags["is_first"] = float_flags["is_first"].float()
    with pytest.raises(TypeError, match="is_first_key='is_first' has dtype torch.float32"):
        loss(float_flags)
    # advantages and value targets [N, W] (no trailing singleton): ClipPPOLoss would broadcast
    # them against its [N, W, 1] terms (a deep error, or an outer product where N == W)
    for name in ("advantage", "value_target"):
        flat = windows.clone()
        flat[name] = flat[name].squeeze(-1)
        with pytest.raises(ValueError, match=rf"{name}_key='{name}' has shape \(5, 4\), expected \(5, 4, 1\)"):
            loss(flat)
    # a stored log-probability [N, W, 1] beside the Categorical's [N, W]: ClipPPOLoss broadcast it
    # to per-slot losses [N, W, W] where N == W (a wrong loss, silently), a deep error elsewhere
    for rows in (4, 5):
        trailing = windows[:rows].clone()
        trailing["action_log_prob"] = trailing["action_log_prob"].unsqueeze(-1)
        with pytest.raises(ValueError, match=rf"sample_log_prob_key='action_log_prob' has shape \({rows}, 4, 1\) "
                                             rf"beside the action's \({rows}, 4\)"):
            loss(trailing)
    assert loss(windows[:4].clone())["loss_objective"].isfinite()  # as the policy writes it: accepted


@pytest.mark.parametrize("mode", ["reset_continue", "mask", "inverse_count"])
def test_logged_diagnostics_are_scalars(mode):
    # ClipPPOLoss reduces ESS and explained variance over dim 0 only, which on windows
    # [N, W] leaves one value per window position; logging needs one number each
    actor, critic, _, _ = make_agent("ResetRNN")
    windows = make_windows(make_rollout([[3, 5, 4], [6, 2, 4]]), 4, memory_key=MEMORY)
    loss = RecurrentPPOLoss(actor, critic, boundary_mode=mode, clip_value=0.2)
    windows["state_value"] = torch.randn(*windows.shape, 1)
    with torch.no_grad(), set_recurrent_mode(True):
        log_weight = actor.get_dist(windows.clone()).log_prob(windows["action"]) - windows["action_log_prob"]
        value = critic(windows.clone())["state_value"]
    out = loss(windows.clone())
    for key in out.keys():
        assert out[key].dim() == 0, (key, out[key].shape)
    # by hand: per window position, then averaged over positions
    weight = log_weight.exp()
    ess = weight.sum(0) ** 2 / (weight**2).sum(0) / weight.shape[0]
    torch.testing.assert_close(out["ESS"], ess.mean(), atol=1e-5, rtol=1e-5)
    target = windows["value_target"]
    explained = 1 - (target - value).var(0, correction=0) / target.var(0, correction=0)
    torch.testing.assert_close(out["explained_variance"], explained.mean(), atol=1e-5, rtol=1e-5)



def test_slot_weights_by_hand():
    # one row of T=5 steps, an episode starts at step 2; windows W=3, stride 1: steps 0-2, 1-3, 2-4
    rollout = TensorDict({
        "obs": torch.zeros(1, 5, OBS),
        "actor_state": torch.zeros(1, 5, HIDDEN),
        ("next", "done"): torch.tensor([[False, True, False, False, False]]).unsqueeze(-1),
    }, [1, 5])
    windows = make_windows(rollout, 3, memory_key="actor_state")
    is_first, count_weight = windows["is_first"], windows["count_weight"]
    n = 1 / 9  # N * W = 9 slots
    assert torch.allclose(slot_weights(is_first, count_weight, "reset_continue"), torch.full((3, 3), n))
    # mask drops the slots from the reset at step 2 on: window 0 keeps steps 0, 1
    expected_mask = torch.tensor([[n, n, 0.0], [n, 0.0, 0.0], [n, n, n]])
    assert torch.allclose(slot_weights(is_first, count_weight, "mask"), expected_mask)
    # windows per step: 1, 2, 3, 2, 1 -> each step's weights sum to 1/5
    per_step = torch.zeros(5)
    weights = slot_weights(is_first, count_weight, "inverse_count")
    for start in range(3):
        per_step[start:start + 3] += weights[start]
    assert torch.allclose(per_step, torch.full((5,), 0.2))


def test_slot_weights_refuses_bad_input():
    with pytest.raises(ValueError, match="boundary_mode"):
        slot_weights(torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 3), "masked")
    with pytest.raises(ValueError, match=r"\[N, W\]"):
        slot_weights(torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 4), "mask")
    with pytest.raises(TypeError, match="is_first must be a torch.Tensor.*ndarray"):
        slot_weights(np.ones((2, 3), dtype=bool), torch.ones(2, 3), "mask")


def test_in_keys_have_a_fixed_order():
    actor, critic, _, _ = make_agent("ResetRNN")
    loss = RecurrentPPOLoss(actor, critic)
    assert loss.in_keys == [
        "action", "action_log_prob", "actor_state", "count_weight", "critic_state", "is_first",
        "is_init", ("next", "actor_state"), ("next", "done"), ("next", "is_first"),
        ("next", "is_init"), ("next", "obs"), ("next", "reward"), ("next", "terminated"), "obs",
    ]
    loss.set_keys(count_weight="a_weight")
    assert "a_weight" in loss.in_keys and loss.in_keys == sorted(
        loss.in_keys, key=lambda key: (key,) if isinstance(key, str) else key
    )


def test_set_keys_checks_a_new_is_first_key_against_the_networks_as_the_constructor_does():
    """set_keys(is_first=...) with a key the ResetRNNs do not read: windows starting mid-episode
    would start from zeros, not from the stored memory; refused as the constructor refuses it."""
    actor, critic, _, _ = make_agent("ResetRNN")
    with pytest.raises(ValueError, match=r"reads is_first_key='is_first' but the windows .*'window_reset'"):
        RecurrentPPOLoss(actor, critic, is_first_key="window_reset")
    loss = RecurrentPPOLoss(actor, critic)
    with pytest.raises(ValueError, match=r"reads is_first_key='is_first' but the windows .*'window_reset'"):
        loss.set_keys(is_first="window_reset")
    assert loss.tensor_keys.is_first == "is_first"  # refused before anything changed
    loss.set_keys(is_first="is_first", count_weight="a_weight")  # the networks' own key passes


def test_overrides_no_private_torchrl_method():
    from torchrl.objectives import ClipPPOLoss

    inherited = {name for cls in ClipPPOLoss.__mro__ for name in vars(cls)}
    private = [
        name for name, value in vars(RecurrentPPOLoss).items()
        if name.startswith("_") and not name.startswith("__") and name in inherited
        and (callable(value) or isinstance(value, property)) and not isinstance(value, type)
    ]
    assert private == []


@pytest.mark.parametrize("mode", ["reset_continue", "mask", "inverse_count"])
def test_torchrl_loss_mask_drops_slots(mode):
    # ("collector", "mask") False slots count in neither the terms nor the denominator
    actor, critic, cells, heads = make_agent("contract")
    rollout = make_rollout([[3, 5, 4], [6, 2, 4]])
    windows = make_windows(rollout, 4, memory_key=MEMORY)
    valid = torch.rand(*windows.shape, 1, generator=torch.Generator().manual_seed(3)) > 0.3
    windows["collector", "mask"] = valid
    ref = reference_slots(rollout, 4, cells, heads)
    valid = valid.squeeze(-1)
    kept = valid & ref["kept"] if mode == "mask" else valid
    weight = ref["weight"] if mode == "inverse_count" else torch.ones_like(ref["weight"])
    out = RecurrentPPOLoss(actor, critic, boundary_mode=mode)(windows)
    for name in ("objective", "critic", "entropy"):
        expected = (ref[name] * weight * kept).sum() / (weight * valid).sum()
        torch.testing.assert_close(out[f"loss_{name}"], expected, atol=1e-5, rtol=1e-5)
    assert out["real_slots"].item() == kept.sum().item()


def elementwise_normal_agent(actions=1):
    """A Normal policy not made Independent: its log-probability is the action's shape [N, W, A]."""
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(nn.Sequential(nn.Linear(3, 2 * actions), NormalParamExtractor()), ["obs"], ["loc", "scale"]),
        ProbabilisticTensorDictModule(["loc", "scale"], ["action"], distribution_class=torch.distributions.Normal,
                                      return_log_prob=True))
    return actor, TensorDictModule(nn.Linear(3, 1), ["obs"], ["state_value"])


def normal_windows(rows, width, seed=0):
    generator = torch.Generator().manual_seed(seed)
    windows = TensorDict({"obs": torch.randn(rows, width, 3, generator=generator),
                          "advantage": torch.randn(rows, width, 1, generator=generator),
                          "value_target": torch.randn(rows, width, 1, generator=generator),
                          "is_first": torch.zeros(rows, width, 1, dtype=torch.bool),
                          "count_weight": torch.ones(rows, width, 1)}, [rows, width])
    windows["is_first"][:, 0] = True
    return windows


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("actions", [1, 3])
def test_an_element_wise_distribution_is_the_clip_ppo_loss(reduction, actions):
    # every slot trains (no reset inside a window) and the networks carry no memory: the loss
    # is TorchRL's ClipPPOLoss on the same batch, whose terms are per action element
    torch.manual_seed(0)
    actor, critic = elementwise_normal_agent(actions)
    windows = normal_windows(6, 4)
    with torch.no_grad():
        actor(windows)  # the stored action and its log-probability [6, 4, A]
        windows["action_log_prob"] += 0.1 * torch.randn(6, 4, actions)  # ratios off 1
    ours = RecurrentPPOLoss(actor, critic, reduction=reduction, entropy_coeff=0.01)(windows.clone())
    theirs = ClipPPOLoss(actor, critic, reduction=reduction, entropy_coeff=0.01)(windows.clone())
    for name in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(ours[name], theirs[name])
    # the plain mean over the slots that train (all here) of each slot's mean, whatever the reduction
    per_element = ClipPPOLoss(actor, critic, reduction="none")(windows.clone())["loss_objective"]
    torch.testing.assert_close(ours["real_mean_objective"], per_element.mean())
    # a stored [N, W] beside the policy's [N, W, 1]: broadcast to [N, W, W] where N == W
    if actions == 1:
        square = normal_windows(4, 4)
        with torch.no_grad():
            actor(square)
        square["action_log_prob"] = square["action_log_prob"].squeeze(-1)
        with pytest.raises(ValueError, match=r"ClipPPOLoss gave loss_objective of shape \(4, 4, 4\) for windows "
                                             r"\(4, 4\).*of shape \(4, 4\)"):
            RecurrentPPOLoss(actor, critic, reduction=reduction)(square)


def test_composite_policies_with_a_log_probability_per_head():
    # TorchRL's CompositeDistribution with a Categorical and an element-wise Normal head, each
    # head's log-probability under its own key (the key lists of set_keys): ClipPPOLoss's losses
    from tensordict.nn import CompositeDistribution, set_composite_lp_aggregate

    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 3 + 4)

        def forward(self, obs):
            out = self.linear(obs)
            return out[..., :3], out[..., 3:5], out[..., 5:].exp()

    with set_composite_lp_aggregate(False):
        torch.manual_seed(0)
        actor = ProbabilisticTensorDictSequential(
            TensorDictModule(Heads(), ["obs"], [("params", "disc", "logits"), ("params", "cont", "loc"),
                                                 ("params", "cont", "scale")]),
            ProbabilisticTensorDictModule(["params"], ["disc", "cont"], distribution_class=CompositeDistribution,
                                          distribution_kwargs={"distribution_map": {
                                              "disc": torch.distributions.Categorical,
                                              "cont": torch.distributions.Normal}}, return_log_prob=True))
        critic = TensorDictModule(nn.Linear(3, 1), ["obs"], ["state_value"])
        windows = normal_windows(5, 4)
        with torch.no_grad():
            actor(windows)
        windows["cont_log_prob"] += 0.3 * torch.randn(5, 4, 2)
        losses = []
        for kind in (RecurrentPPOLoss, ClipPPOLoss):
            loss = kind(actor, critic)
            loss.set_keys(action=["disc", "cont"], sample_log_prob=["disc_log_prob", "cont_log_prob"])
            losses.append(loss(windows.clone()))
    for name in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(losses[0][name], losses[1][name])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_per_token_heads_are_the_clip_ppo_loss(reduction):
    # two Categorical heads per step (logits [N, W, 2, K]): log-probability [N, W, 2], the leading
    # dim of the action's [N, W, 2]; TorchRL broadcasts the advantage over the heads
    torch.manual_seed(0)
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(nn.Sequential(nn.Linear(3, 6), nn.Unflatten(-1, (2, 3))), ["obs"], ["logits"]),
        ProbabilisticTensorDictModule(["logits"], ["action"], distribution_class=torch.distributions.Categorical,
                                      return_log_prob=True))
    critic = TensorDictModule(nn.Linear(3, 1), ["obs"], ["state_value"])
    windows = normal_windows(5, 4)
    with torch.no_grad():
        actor(windows)
        windows["action_log_prob"] += 0.1 * torch.randn(5, 4, 2)
    ours = RecurrentPPOLoss(actor, critic, reduction=reduction)(windows.clone())
    theirs = ClipPPOLoss(actor, critic, reduction=reduction)(windows.clone())
    for name in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(ours[name], theirs[name])


def _outputs_and_grads(loss, windows, params):
    out = loss(windows.clone())
    total = sum(value for name, value in out.items() if name.startswith("loss_") and value.requires_grad)
    return out, torch.autograd.grad(total, params)


@pytest.mark.parametrize("mode", ["reset_continue", "mask", "inverse_count"])
@pytest.mark.parametrize("options", [{}, {"normalize_advantage": True, "entropy_coeff": 0.0},
                                     {"clip_value": 0.3, "loss_critic_type": "l2", "reduction": "sum"},
                                     {"entropy_coeff": 0.05, "log_explained_variance": False}])
def test_plain_tensor_pass_is_the_torchrl_forward(mode, options):
    # the networks on plain tensors against ClipPPOLoss's own forward (functional=True runs it): the
    # same entries in the same order, the same values and gradients, with TorchRL's loss masks too
    actor, critic, cells, heads = make_agent("ResetRNN")
    windows = make_windows(make_rollout([[3, 5, 4], [6, 2, 4]]), 4, memory_key=MEMORY)
    windows["state_value"] = torch.randn(*windows.shape, 1)
    windows["collector", "mask"] = torch.rand(*windows.shape, 1, generator=torch.Generator().manual_seed(1)) > 0.2
    params = [p for module in (*cells.values(), *heads.values()) for p in module.parameters()]
    plain = RecurrentPPOLoss(actor, critic, boundary_mode=mode, **options)
    torchrl = RecurrentPPOLoss(actor, critic, boundary_mode=mode, functional=True, **options)
    assert plain._plain_path() is not None and torchrl._plain_path() is None
    (ours, our_grads), (theirs, their_grads) = (_outputs_and_grads(loss, windows, params) for loss in (plain, torchrl))
    assert list(ours.keys()) == list(theirs.keys())
    for name in ours.keys():
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0)
    for ours_grad, theirs_grad in zip(our_grads, their_grads):
        torch.testing.assert_close(ours_grad, theirs_grad, rtol=0, atol=0)


def test_diagnostics_off_keeps_the_losses_alone():
    actor, critic, cells, heads = make_agent("ResetRNN")
    windows = make_windows(make_rollout([[3, 5, 4], [6, 2, 4]]), 4, memory_key=MEMORY)
    full = RecurrentPPOLoss(actor, critic)(windows.clone())
    for functional in (False, True):  # the plain pass and ClipPPOLoss's forward
        loss = RecurrentPPOLoss(actor, critic, diagnostics=False, functional=functional)
        out = loss(windows.clone())
        assert list(out.keys()) == loss.out_keys == ["loss_objective", "loss_entropy", "loss_critic"]
        for name in out.keys():
            torch.testing.assert_close(out[name], full[name], rtol=0, atol=0)
    loss.diagnostics = True  # for one batch
    assert set(loss(windows.clone()).keys()) == set(full.keys()) and "real_slots" in loss.out_keys
    with pytest.raises(TypeError, match="diagnostics must be a bool"):
        RecurrentPPOLoss(actor, critic, diagnostics=1)


def test_an_entropy_coefficient_of_zero_keeps_the_term_out_of_the_graph():
    actor, critic, cells, heads = make_agent("ResetRNN")
    windows = make_windows(make_rollout([[3, 5, 4], [6, 2, 4]]), 4, memory_key=MEMORY)
    params = [p for module in (*cells.values(), *heads.values()) for p in module.parameters()]
    for diagnostics in (True, False):
        loss = RecurrentPPOLoss(actor, critic, entropy_coeff=0.0, diagnostics=diagnostics)
        out = loss(windows.clone())
        assert out["loss_entropy"].item() == 0 and not out["loss_entropy"].requires_grad
    reference = RecurrentPPOLoss(actor, critic, entropy_coeff=0.0, functional=True)
    (ours, our_grads), (theirs, their_grads) = (_outputs_and_grads(loss, windows, params) for loss in (loss, reference))
    for ours_grad, theirs_grad in zip(our_grads, their_grads):
        torch.testing.assert_close(ours_grad, theirs_grad, rtol=0, atol=0)
    loss.entropy_coeff.fill_(0.5)  # a coefficient changed in place weighs again
    torch.testing.assert_close(loss(windows.clone())["loss_entropy"], -0.5 * theirs["entropy"])


def test_a_hook_or_carry_added_after_the_first_call_runs_the_modules_themselves():
    actor, critic, cells, heads = make_agent("ResetRNN")
    windows = make_windows(make_rollout([[3, 5, 4], [6, 2, 4]]), 4, memory_key=MEMORY)
    loss = RecurrentPPOLoss(actor, critic)
    loss(windows.clone())
    calls = []
    head = actor.module[1]
    head.register_forward_hook(lambda *args: calls.append(1))
    assert loss._plain_path() is None
    loss(windows.clone())
    assert calls == [1]
    critic.module[0].carry = True  # a carrying ResetRNN marks the chunk: the module itself runs it
    assert loss._plain_path() is None


def test_functional_defaults_to_false_and_a_state_dict_of_the_other_layout_is_refused():
    actor, critic, cells, heads = make_agent("ResetRNN")
    ours, theirs = RecurrentPPOLoss(actor, critic), RecurrentPPOLoss(actor, critic, functional=True)
    assert not ours.functional and theirs.functional
    assert [id(p) for p in ours.parameters()] == [id(p) for p in theirs.parameters()]  # the same tensors, in order
    with pytest.raises(ValueError, match=r"actor_network_params\.\*.*build this one with functional=True"):
        ours.load_state_dict(theirs.state_dict())
    with pytest.raises(ValueError, match=r"actor_network\.\*.*build this one with functional=False"):
        theirs.load_state_dict(ours.state_dict())
    with pytest.raises(TypeError, match="functional must be a bool"):
        RecurrentPPOLoss(actor, critic, functional=None)
