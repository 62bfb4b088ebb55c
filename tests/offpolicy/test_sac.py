"""RecurrentSACLoss against a per-episode, per-step loop of the same actor and critic."""
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule as Mod, TensorDictSequential as Seq
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import ProbabilisticActor, TanhNormal
from torchrl.modules.distributions.utils import rsample_and_log_prob
from torchrl.objectives import SoftUpdate

from torchrl_seqchunk import RecurrentSACLoss, ResetRNN

OBS, EMBED, HIDDEN, ACT = 3, 4, 5, 2
CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}


class Head(nn.Module):
    """Q(z, a): one hidden layer on the critic's features and the action."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(HIDDEN + ACT, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, features, action):
        return self.net(torch.cat([features, action], -1))


def networks(cell="gru"):
    """(actor, actor_rnn, critic, critic_rnn, head), float64, each with its own encoder."""
    actor_rnn = ResetRNN(CELLS[cell](EMBED, HIDDEN, batch_first=True), in_key="a_embed", out_key="a_features",
                         state_key="a_state", reset_state_key="a_state")
    body = Seq(Mod(nn.Linear(OBS, EMBED), ["observation"], ["a_embed"]), actor_rnn,
               Mod(nn.Sequential(nn.Linear(HIDDEN, 2 * ACT), NormalParamExtractor()), ["a_features"], ["loc", "scale"]))
    actor = ProbabilisticActor(body, in_keys=["loc", "scale"], distribution_class=TanhNormal,
                               distribution_kwargs={"low": -2.0, "high": 2.0}, spec=Bounded(-2.0, 2.0, (ACT,)))
    critic_rnn = ResetRNN(CELLS[cell](EMBED, HIDDEN, batch_first=True), in_key="c_embed", out_key="c_features",
                          state_key="c_state", reset_state_key="c_state")
    critic = Seq(Mod(nn.Linear(OBS, EMBED), ["observation"], ["c_embed"]), critic_rnn)
    head = Mod(Head(), ["c_features", "action"], ["state_action_value"])
    return actor.double(), actor_rnn, critic.double(), critic_rnn, head.double()


def sac_loss(cell="gru", **kwargs):
    actor, actor_rnn, critic, critic_rnn, head = networks(cell)
    loss = RecurrentSACLoss(actor, actor_rnn, critic, critic_rnn, head, **{"loss_function": "l2", **kwargs})
    SoftUpdate(loss, tau=0.1)
    with torch.no_grad():  # the target critic differs from the critic
        for p in loss.target_qvalue_network_params.values(True, True):
            p.add_(0.3 * torch.randn_like(p))
        loss.log_alpha.fill_(-0.7)
    return loss


def make_chunk(steps=9, rows=4, seed=0):
    """Row 0: is_first at 0, terminated at 2; row 1: truncated at 4 (a final observation of its
    own); row 2: no boundary (the chunk end); row 3: is_first at 0, truncated at the last step."""
    g = torch.Generator().manual_seed(seed)
    flag = lambda: torch.zeros(rows, steps, 1, dtype=torch.bool)  # noqa: E731
    done, terminated, is_first = flag(), flag(), flag()
    done[0, 2] = terminated[0, 2] = True
    done[1, 4] = True
    done[3, -1] = True
    is_first[:, 1:] = done[:, :-1]
    is_first[0, 0] = is_first[3, 0] = True
    obs = torch.randn(rows, steps, OBS, generator=g, dtype=torch.float64)
    next_obs = torch.randn(rows, steps, OBS, generator=g, dtype=torch.float64)  # final, chunk end
    inside = ~is_first[:, 1:, 0]
    next_obs[:, :-1][inside] = obs[:, 1:][inside]
    return TensorDict({
        "observation": obs, ("next", "observation"): next_obs,
        "is_first": is_first, ("next", "done"): done, ("next", "terminated"): terminated,
        ("next", "truncated"): done & ~terminated,
        ("next", "reward"): torch.randn(rows, steps, 1, generator=g, dtype=torch.float64),
        "action": torch.rand(rows, steps, ACT, generator=g, dtype=torch.float64) * 3.8 - 1.9,
    }, batch_size=[rows, steps])


def zeros(entries):
    return tuple(torch.zeros(1, 1, HIDDEN, dtype=torch.float64) for _ in range(entries))


def trace(network, rnn, td, initial):
    """By hand, step by step: the features after every o_t and after every next o_t under the
    memory after step t ([B, T, H] each), and each row's final state; episodes start from zeros."""
    encoder = network[0].module
    rows, steps = td.shape
    features, next_features = (torch.zeros(rows, steps, HIDDEN, dtype=torch.float64) for _ in range(2))
    finals = []

    def step(obs, state):
        y, new = rnn.rnn(encoder(obs).view(1, 1, -1), state if len(state) > 1 else state[0])
        return y.view(-1), new if isinstance(new, tuple) else (new,)

    for b in range(rows):
        state = initial(b)
        for t in range(steps):
            if td["is_first"][b, t]:
                state = zeros(len(state))
            features[b, t], state = step(td["observation"][b, t], state)
            next_features[b, t], _ = step(td["next", "observation"][b, t], state)
        if td["next", "done"][b, -1]:
            state = zeros(len(state))
        finals.append(state)
    return features, next_features, finals


def dist(loss, features):
    """The actor's TanhNormal at features [B, T, H], by its head."""
    loc, scale = loss.actor_network.module[0][-1].module(features)
    return loss.actor_network.build_dist_from_params(TensorDict(loc=loc, scale=scale, batch_size=features.shape[:2]))


def heads(loss, features, action):
    """[n, B, T, 1]: every Q head by hand."""
    return torch.stack([h.module(features, action) for h in loss.qvalue_network.heads])


def reference(loss, td, initial, seed, n_steps=1):
    """Every output of the loss on td from the states initial[name](b), by hand."""
    nets = {"actor": (loss.actor_network.module[0], loss.rnns[0], loss.actor_network_params),
            "critic": (loss.qvalue_network.encoder, loss.rnns[1], loss.qvalue_network_params),
            "target_critic": (loss.qvalue_network.encoder, loss.rnns[1], loss.target_qvalue_network_params)}
    traces = {}
    for name, (network, rnn, params) in nets.items():
        with params.to_module(loss.actor_network if name == "actor" else loss.qvalue_network):
            traces[name] = trace(network, rnn, td, initial[name])
    with loss.target_qvalue_network_params.to_module(loss.qvalue_network):
        torch.manual_seed(seed)
        next_action, next_log_prob = rsample_and_log_prob(dist(loss, traces["actor"][1]))
        next_q = heads(loss, traces["target_critic"][1], next_action).min(0).values.squeeze(-1)
    alpha = loss.log_alpha.exp().item()
    v_next = next_q - alpha * next_log_prob
    r, done = td["next", "reward"].squeeze(-1), td["next", "done"].squeeze(-1)
    term, first = td["next", "terminated"].squeeze(-1), td["is_first"].squeeze(-1)
    rows, steps = td.shape
    target = torch.zeros(rows, steps, dtype=torch.float64)
    for b in range(rows):
        for t in range(steps):
            total, j = r[b, t], t
            while j - t + 1 < n_steps and not done[b, j] and j + 1 < steps and not first[b, j + 1]:
                j += 1
                total = total + loss.gamma ** (j - t) * r[b, j]
            if not term[b, j]:
                total = total + loss.gamma ** (j - t + 1) * v_next[b, j]
            target[b, t] = total
    with loss.qvalue_network_params.to_module(loss.qvalue_network):
        q = heads(loss, traces["critic"][0], td["action"]).squeeze(-1)  # [n, B, T]
        pi_action, log_prob = rsample_and_log_prob(dist(loss, traces["actor"][0]))
        pi_q = heads(loss, traces["critic"][0], pi_action).min(0).values.squeeze(-1)
    return {"value_target": target, "loss_qvalue": ((q - target) ** 2).sum(0).mean(),
            "loss_actor": (alpha * log_prob - pi_q).mean(), "entropy": -log_prob.mean(),
            "loss_alpha": (-loss.log_alpha * (log_prob + loss.target_entropy)).mean(),
            "td_error": (q - target).abs().mean()}, {k: v[2] for k, v in traces.items()}


def random_states(loss, rows, seed):
    g = torch.Generator().manual_seed(seed)
    entries = {"actor": len(loss.rnns[0].state_keys), "critic": len(loss.rnns[1].state_keys)}
    return {name: tuple(torch.randn(rows, 1, HIDDEN, generator=g, dtype=torch.float64)
                        for _ in range(entries[name.split("_")[-1]]))
            for name in ("actor", "critic", "target_critic")}


def from_states(states):
    return {name: (lambda b, h=h: tuple(x[b:b + 1] for x in h)) for name, h in states.items()}


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_targets_at_every_boundary_match_a_per_episode_reference(cell):
    loss = sac_loss(cell, gamma=0.9)
    td = make_chunk()
    states = random_states(loss, 4, 1)  # rows 1, 2 continue from them; rows 0, 3 start episodes
    loss.carries.states = dict(states)
    torch.manual_seed(5)
    out = loss(td)
    want, _ = reference(loss, td, from_states(states), seed=5)
    got = out["value_target"].squeeze(-1)
    torch.testing.assert_close(got, want["value_target"])
    r = td["next", "reward"].squeeze(-1)
    assert torch.equal(got[0, 2], r[0, 2])  # termination: the reward alone
    # truncation at row 1, step 4: its own final observation, not the next episode's first one
    wrong = td.clone()
    wrong["next", "observation"][1, 4] = td["observation"][1, 5]
    loss.carries.states = dict(states)
    torch.manual_seed(5)
    assert not torch.allclose(loss(wrong)["value_target"][1, 4], out["value_target"][1, 4])
    # the chunk end (row 2) bootstraps from ("next", "observation") under the carried memories
    moved = td.clone()
    moved["next", "observation"][2, -1] += 1.0
    loss.carries.states = dict(states)
    torch.manual_seed(5)
    assert not torch.allclose(loss(moved)["value_target"][2, -1], out["value_target"][2, -1])
    # is_first at t = 0 (rows 0, 3): the carried states do not reach the row
    loss.carries.states = {k: tuple(h * 7 for h in v) for k, v in states.items()}
    torch.manual_seed(5)
    other = loss(td)["value_target"]
    torch.testing.assert_close(other[[0, 3]], out["value_target"][[0, 3]])
    assert not torch.allclose(other[[1, 2]], out["value_target"][[1, 2]])


@pytest.mark.parametrize("n_steps", [1, 3])
def test_losses_match_a_per_step_reference(n_steps):
    loss = sac_loss("lstm", gamma=0.8, n_steps=n_steps)
    td = make_chunk(steps=6, seed=3)
    states = random_states(loss, 4, 2)
    loss.carries.states = dict(states)
    torch.manual_seed(11)
    out = loss(td)
    want, finals = reference(loss, td, from_states(states), seed=11, n_steps=n_steps)
    for key, value in want.items():
        torch.testing.assert_close(out[key].squeeze(-1), value, msg=key)
    torch.testing.assert_close(out["alpha"], loss.log_alpha.exp().detach())
    # actor and target critic: 6 steps, row 1's final observation and the chunk end; the critic 6 steps
    assert int(out["recurrent_steps"]) == 2 * 4 * (6 + 1 + 1) + 4 * 6


def test_the_carry_under_the_losses_passes_equals_one_long_unroll():
    """Actor, critic and target critic each carry their own state from chunk to chunk: after
    three consecutive chunks of the same rows, each equals the state of a per-step loop over the
    whole sequence, and the last chunk's targets equal those of that loop."""
    loss = sac_loss("gru", gamma=0.9)
    whole = make_chunk(steps=15, seed=4)
    whole["is_first"][[1, 2], 0] = True  # the sequence starts every row's first episode
    # a truncation at the end of the first chunk, whose final observation is its own
    whole["next", "done"][2, 4] = whole["next", "truncated"][2, 4] = True
    whole["is_first"][2, 5] = True
    whole["next", "observation"][2, 4] = torch.randn(OBS, dtype=torch.float64)
    for chunk in (whole[:, :5], whole[:, 5:10], whole[:, 10:]):
        torch.manual_seed(2)
        out = loss(chunk.clone())
    start = {name: (lambda b: zeros(1)) for name in ("actor", "critic", "target_critic")}
    want, finals = reference(loss, whole, start, seed=0)
    for name in ("actor", "critic", "target_critic"):
        torch.testing.assert_close(loss.carries.states[name][0], torch.cat([f[0] for f in finals[name]]), msg=name)
    # the last chunk's targets: the reference over the whole sequence draws other next actions,
    # so compare with the reference on the last chunk from the states the loop reaches at step 10
    _, at_ten = reference(loss, whole[:, :10], start, seed=0)
    last, _ = reference(loss, whole[:, 10:], {k: (lambda b, f=f: f[b]) for k, f in at_ten.items()}, seed=2)
    torch.testing.assert_close(out["value_target"].squeeze(-1), last["value_target"])
    assert not torch.allclose(loss.carries.states["critic"][0], loss.carries.states["target_critic"][0])


def test_gradients_reach_only_the_networks_each_loss_trains():
    loss = sac_loss()
    out = loss(make_chunk())
    actor = list(loss.actor_network_params.values(True, True))
    critic = list(loss.qvalue_network_params.values(True, True))
    grads = lambda value, params: torch.autograd.grad(value, params, allow_unused=True)  # noqa: E731
    assert all(g is None or not g.any() for g in grads(out["loss_qvalue"], actor + [loss.log_alpha]))
    assert all(g is None or not g.any() for g in grads(out["loss_actor"], critic + [loss.log_alpha]))
    assert all(g is None or not g.any() for g in grads(out["loss_alpha"], actor + critic))
    assert all(g is not None and g.abs().sum() > 0 for g in grads(out["loss_actor"], actor))
    assert all(g is not None for g in grads(out["loss_qvalue"], critic))


def test_stored_states_start_each_network_from_its_own_memory():
    td = make_chunk()
    td["is_first"][:, 0] = False
    g = torch.Generator().manual_seed(6)
    td["a_state"] = torch.randn(4, 9, 1, HIDDEN, generator=g, dtype=torch.float64)
    td["c_state"] = torch.randn(4, 9, 1, HIDDEN, generator=g, dtype=torch.float64)
    stored = sac_loss(initial_state="stored")
    carried = sac_loss()
    carried.load_state_dict(stored.state_dict())
    carried.carries.states = {"actor": (td["a_state"][:, 0],), "critic": (td["c_state"][:, 0],),
                              "target_critic": (td["c_state"][:, 0],)}
    outs = []
    for loss in (stored, carried):
        torch.manual_seed(0)
        outs.append(loss(td))
    torch.testing.assert_close(outs[0]["value_target"], outs[1]["value_target"])
    torch.testing.assert_close(outs[0]["loss_actor"], outs[1]["loss_actor"])
    with pytest.raises(ValueError, match="c_state"):
        stored(td.exclude("c_state"))


def test_mask_and_burn_in():
    loss = sac_loss(initial_state="zero", burn_in=2, mask_key="learn")
    td = make_chunk()
    td["learn"] = torch.ones(4, 9, dtype=torch.bool)
    torch.manual_seed(0)
    out = loss(td)
    assert out["value_target"].shape == (4, 7, 1)
    td["learn"][:, 2:5] = False  # the loss counts the other steps only
    torch.manual_seed(0)
    masked = loss(td)
    assert not torch.allclose(masked["loss_qvalue"], out["loss_qvalue"])
    torch.testing.assert_close(masked["value_target"], out["value_target"])
    with pytest.raises(ValueError, match="burn_in=2 leaves none"):
        loss(td[:, :2])


def test_target_entropy_and_alpha():
    assert float(sac_loss().target_entropy) == -ACT  # minus the action's size, from the actor's spec
    loss = sac_loss(target_entropy=-0.5, alpha_init=0.2, fixed_alpha=True)
    assert float(loss.target_entropy) == -0.5 and "log_alpha" not in dict(loss.named_parameters())
    bounded = sac_loss(min_alpha=0.5, max_alpha=0.6)
    torch.testing.assert_close(bounded.alpha, torch.tensor(0.5))  # log_alpha -0.7 clamped up
    actor, actor_rnn, critic, critic_rnn, head = networks()
    unspecified = ProbabilisticActor(actor.module[0], in_keys=["loc", "scale"], distribution_class=TanhNormal)
    with pytest.raises(ValueError, match="target_entropy='auto'"):
        RecurrentSACLoss(unspecified, actor_rnn, critic, critic_rnn, head)


def test_bad_networks_are_named():
    actor, actor_rnn, critic, critic_rnn, head = networks()
    with pytest.raises(ValueError, match="same module"):
        RecurrentSACLoss(actor, actor_rnn, critic, actor_rnn, head)
    with pytest.raises(ValueError, match="critic_network does not contain critic_rnn"):
        RecurrentSACLoss(actor, actor_rnn, Seq(critic[0]), critic_rnn, head)
    with pytest.raises(ValueError, match="qvalue_head must read"):
        RecurrentSACLoss(actor, actor_rnn, critic, critic_rnn, Mod(nn.Linear(HIDDEN, 1), ["c_features"], ["q"]))
    with pytest.raises(TypeError, match="ProbabilisticTensorDictSequential"):
        RecurrentSACLoss(actor.module[0], actor_rnn, critic, critic_rnn, head)
    loss = RecurrentSACLoss(actor, actor_rnn, critic, critic_rnn, head, num_qvalue_nets=3)
    first, *others = (list(h.parameters())[0] for h in loss.qvalue_network.heads)
    assert len(others) == 2 and all(not torch.equal(first, o) for o in others)  # re-initialized copies


def test_the_carries_travel_in_the_state_dict_and_reset_carry_forgets_them():
    loss = sac_loss()
    td = make_chunk()
    loss(td[:, :5])
    resumed = sac_loss()
    resumed.load_state_dict(loss.state_dict())
    for name in ("actor", "critic", "target_critic"):
        assert torch.equal(resumed.carries.states[name][0], loss.carries.states[name][0])
    outs = []
    for each in (loss, resumed):
        torch.manual_seed(3)
        outs.append(each(td[:, 5:])["value_target"])
    torch.testing.assert_close(outs[0], outs[1])
    loss.reset_carry(torch.tensor([True, False, False, False]))
    assert not loss.carries.states["actor"][0][0].any() and loss.carries.states["actor"][0][1].any()
    loss.reset_carry()
    assert all(state is None for state in loss.carries.states.values())
    with pytest.raises(ValueError, match="action_key='action' is not in the batch"):
        loss(td.exclude("action"))
    assert all(state is None for state in loss.carries.states.values())  # refused before any pass
