"""The carried state survives a loss that runs the network several times on one chunk."""
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.modules import QValueModule
from torchrl.objectives import DQNLoss, SoftUpdate

from torchrl_seqchunk import ResetRNN, StreamChunkSampler

OBS, H, ACTIONS, B, T, GAMMA = 3, 6, 2, 4, 7, 0.9


def episodes_buffer(seed=0):
    """A replay buffer of episodes of lengths 1..6, stored as a collector stores them."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (40,), generator=gen)
    steps = int(lengths.sum())
    done = torch.zeros(steps, 1, dtype=torch.bool)
    done[lengths.cumsum(0) - 1] = True
    terminated = done & (torch.rand(steps, 1, generator=gen) < 0.5)
    obs = torch.randn(steps + 1, OBS, generator=gen)
    data = TensorDict({
        "observation": obs[:-1],
        "action": torch.randint(ACTIONS, (steps,), generator=gen),
        ("next", "observation"): obs[1:],
        ("next", "reward"): torch.randn(steps, 1, generator=gen),
        ("next", "done"): done, ("next", "terminated"): terminated,
        ("next", "truncated"): done & ~terminated,
        ("next", "is_first"): torch.zeros(steps, 1, dtype=torch.bool),  # as InitTracker stores it
    }, batch_size=[steps])
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(steps),
        sampler=StreamChunkSampler(B, T, generator=torch.Generator().manual_seed(seed)),
        batch_size=B * T,
    )
    rb.extend(data)
    return rb


def q_network():
    rnn = ResetRNN(nn.GRU(OBS, H, batch_first=True), in_key="observation",
                   default_recurrent_mode=True)
    net = TensorDictSequential(
        rnn,
        TensorDictModule(nn.Linear(H, ACTIONS), ["features"], ["action_value"]),
        QValueModule(action_space="categorical"),
    )
    return net, rnn


def unroll(gru, head, x, is_first, h):
    """Per-step reference: ``h`` [B, H] reset to zeros where ``is_first``; Q [B, T, A], end state."""
    q = []
    for t in range(x.shape[1]):
        h = torch.where(is_first[:, t, None], torch.zeros_like(h), h)
        h = torch.gru_cell(x[:, t], h, gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0)
        q.append(head(h))
    return torch.stack(q, 1), h


@pytest.mark.parametrize("double_dqn", [False, True])
def test_dqn_loss_carries_the_online_pass_and_resets_the_next_view(double_dqn):
    rb = episodes_buffer()
    net, rnn = q_network()
    loss = DQNLoss(net, action_space="categorical", delay_value=True, double_dqn=double_dqn)
    loss.make_value_estimator(gamma=GAMMA)
    SoftUpdate(loss, eps=0.99)  # as a user would; the test never steps it
    with torch.no_grad():  # a target network that differs from the online one
        loss.target_value_network_params.apply(lambda p: p.add_(0.3 * torch.randn_like(p)))
    gru, head = rnn.rnn, net[1].module
    h = torch.zeros(B, H)
    next_starts = 0
    for _ in range(4):
        chunk = rb.sample()
        out = loss(chunk)
        is_first = chunk["is_first"].squeeze(-1)
        with torch.no_grad():
            q, h_end = unroll(gru, head, chunk["observation"], is_first, h)
            # the next view: next observations from the same start, reset where episodes start
            next_obs = chunk["next", "observation"]
            with loss.target_value_network_params.to_module(net):
                q_next, _ = unroll(gru, head, next_obs, is_first, h)
            if double_dqn:
                q_online, _ = unroll(gru, head, next_obs, is_first, h)
                best = q_next.gather(-1, q_online.argmax(-1, keepdim=True)).squeeze(-1)
            else:
                best = q_next.max(-1).values
        not_terminal = ~chunk["next", "terminated"].squeeze(-1)
        target = chunk["next", "reward"].squeeze(-1) + GAMMA * best * not_terminal
        pred = q.gather(-1, chunk["action"].unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(out["loss"], (pred - target).pow(2).mean(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rnn.carried_state["recurrent_state"][:, 0], h_end, atol=1e-6, rtol=0)
        next_starts += int(is_first[:, 1:].sum())
        h = h_end
    assert next_starts > 0  # episodes started inside chunks, so the next view had to reset


def test_a_second_pass_over_the_chunk_starts_from_the_same_state():
    rb = episodes_buffer(1)
    net, rnn = q_network()
    chunk = rb.sample()
    first = net(chunk)["action_value"].clone()
    carried = rnn.carried_state
    second = net(chunk)["action_value"]  # e.g. a target pass: same start, carry unchanged
    torch.testing.assert_close(second, first)
    torch.testing.assert_close(rnn.carried_state, carried)
    assert chunk["next", "is_first"].equal(chunk["is_first"])
    assert (chunk["recurrent_state_start"] == 0).all()  # the state it started from (none yet)


@pytest.mark.parametrize("root_shape, next_shape", [((4, 4), (4, 4, 1)), ((4, 4, 1), (4, 4)), ((2, 5), (2, 5, 1))])
def test_the_next_views_flags_keep_their_shape_when_the_two_flags_differ_in_a_trailing_1(root_shape, next_shape):
    # [B, T] root flags beside [B, T, 1] next flags (both allowed): row b, step t of each, never
    # broadcast into [B, T, T] (which B == T made silent)
    rnn = ResetRNN(nn.GRU(3, 5, batch_first=True), default_recurrent_mode=True, carry=True)
    root = torch.rand(root_shape[:2], generator=torch.Generator().manual_seed(0)) < 0.3
    after = torch.rand(root_shape[:2], generator=torch.Generator().manual_seed(1)) < 0.3
    td = TensorDict({"embed": torch.randn(*root_shape[:2], 3), "is_first": root.reshape(root_shape),
                     ("next", "is_first"): after.reshape(next_shape)}, list(root_shape[:2]))
    rnn(td)
    assert td["next", "is_first"].shape == next_shape
    assert td["next", "is_first"].reshape(root.shape).equal(root | after)


def test_a_later_pass_over_a_time_slice_is_refused_and_over_rows_starts_from_their_state():
    rb = episodes_buffer(1)
    net, rnn = q_network()
    chunk = rb.sample()
    whole = net(chunk)["action_value"].clone()
    for view, first in ((chunk[:, 3:], "3, 4"), (chunk[:, ::2], "0, 2"), (chunk[:, 1::3], "1, 4")):
        with pytest.raises(ValueError, match=rf"time slice of a chunk .* \(its steps \[{first}"):
            net(view)  # it started from the chunk's first state: values unlike whole's steps
    torch.testing.assert_close(net(chunk[1:])["action_value"], whole[1:])


def test_carried_state_can_be_taken_and_restored():
    rb = episodes_buffer(2)
    net, rnn = q_network()
    assert rnn.carried_state is None
    net(rb.sample())
    saved = rnn.carried_state.clone()
    assert saved.batch_size == (B,) and saved["recurrent_state"].shape == (B, 1, H)
    chunk = rb.sample()
    after = net(chunk.clone())["action_value"]
    rnn.carried_state = saved
    torch.testing.assert_close(net(chunk.clone())["action_value"], after)
    rnn.carried_state = None
    assert rnn.carried_state is None
    with pytest.raises(ValueError, match="carry entry 'recurrent_state'"):
        rnn.carried_state = TensorDict({"recurrent_state": torch.zeros(B, H)}, [B])
    with pytest.raises(TypeError, match="carried_state"):
        rnn.carried_state = torch.zeros(B, 1, H)


def test_a_pass_over_no_row_keeps_the_carry():
    rb = episodes_buffer(2)
    net, rnn = q_network()
    net(rb.sample())
    saved = rnn.carried_state.clone()
    net(rb.sample()[:0])  # B = 0 (e.g. a filtered batch left nothing)
    torch.testing.assert_close(rnn.carried_state, saved)


def test_a_plain_torchrl_collector_drives_a_reset_rnn_policy(recwarn):
    """Auto-registration adds InitTracker("is_init") and the primer; step mode reads is_init."""
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv

    torch.manual_seed(0)
    rnn = ResetRNN(nn.GRUCell(4, H), in_key="observation")
    head = nn.Linear(H, 2)
    policy = TensorDictSequential(
        rnn, TensorDictModule(lambda f: head(f).argmax(-1), ["features"], ["action"])
    )
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    collector = Collector(env, policy, frames_per_batch=60, total_frames=60,
                          auto_register_policy_transforms=True)
    rollout = next(iter(collector))
    collector.shutdown()
    assert not [w for w in recwarn if issubclass(w.category, (FutureWarning, UserWarning))], [
        str(w.message) for w in recwarn
    ]
    starts = rollout["is_init"].squeeze(-1)
    assert starts[0] and starts[1:].any()  # episodes started inside the batch
    h = torch.zeros(H)
    for t in range(rollout.shape[0]):  # per-step reference: zeros at is_init, else carried
        h = torch.zeros(H) if starts[t] else h
        torch.testing.assert_close(rollout["recurrent_state"][t], h)
        with torch.no_grad():
            h = rnn.rnn(rollout["observation"][t], h)
        torch.testing.assert_close(rollout["next", "recurrent_state"][t], h)


def test_a_separate_target_network_carries_its_own_state_or_is_named():
    import copy

    rb = episodes_buffer(3)
    online, online_rnn = q_network()
    target = copy.deepcopy(online)
    chunk = rb.sample()
    online(chunk)
    with pytest.raises(ValueError, match="its own state_key"):
        target(chunk)  # same state_key: it would take the online network's start state
    target_rnn = ResetRNN(copy.deepcopy(online_rnn.rnn), in_key="observation",
                          state_key="target_state", default_recurrent_mode=True)
    for _ in range(2):
        chunk = rb.sample()
        online(chunk)
        target_rnn(chunk)
        target_rnn(chunk)  # a second target pass: same start, no second carry
    # same weights, same chunks: each network carried the same state on its own
    torch.testing.assert_close(target_rnn.carried_state["target_state"],
                               online_rnn.carried_state["recurrent_state"])
