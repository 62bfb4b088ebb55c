"""TorchRL's own LSTMModule / GRUModule inside ResetRNN: the carry, its keys, its backends."""
import copy
import warnings

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs.utils import step_mdp
from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode

from torchrl_seqchunk import RecurrentDQNLoss, ResetRNN, StreamChunkSampler, make_windows

F, H, B, T, CHUNKS = 3, 5, 3, 6, 3


def torchrl_module(kind, layers=1, backend="pad", python_based=False):
    torch.manual_seed(0)
    cls = LSTMModule if kind == "lstm" else GRUModule
    return cls(input_size=F, hidden_size=H, num_layers=layers, in_key="obs", out_key="feat",
               recurrent_backend=backend, python_based=python_based)


def starts(steps=T * CHUNKS):
    """Episode starts at a chunk's t = 0 (row 0, t = 6), mid-chunk and at a chunk's last step."""
    first = torch.zeros(B, steps, 1, dtype=torch.bool)
    first[0, 0] = first[0, 6] = first[1, 4] = first[1, 11] = first[2, 5] = first[2, 9] = True
    return first


def per_step(module, x, first):
    """Independent reference: the TorchRL module itself in step mode, one step at a time, its
    state handed from step to step as its primer and InitTracker would (zeroed at is_init)."""
    keys = module.in_keys[1:-1]
    state = {k: torch.zeros(x.shape[0], module_layers(module), H) for k in keys}
    out = []
    for t in range(x.shape[1]):
        td = TensorDict({"obs": x[:, t], "is_init": first[:, t], **state}, [x.shape[0]])
        with set_recurrent_mode(False):
            td = module(td)
        out.append(td["feat"])
        state = {k: td["next", k] for k in keys}
    return torch.stack(out, 1), state


def module_layers(module):
    return (module.lstm if isinstance(module, LSTMModule) else module.gru).num_layers


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("backend", ["pad", "scan", "python"])
def test_carry_equals_a_per_step_unroll(kind, layers, backend):
    module = torchrl_module(kind, layers, "pad" if backend == "python" else backend, backend == "python")
    picked = ResetRNN(module).backend  # ours on TorchRL's default pad, else its own
    assert picked == ("auto" if backend == "pad" else "torchrl")
    rnn = ResetRNN(module, backend="torchrl")  # TorchRL's recurrent mode, its backend
    assert rnn.state_keys == module.in_keys[1:-1] and (rnn.in_key, rnn.out_key) == ("obs", "feat")
    gen = torch.Generator().manual_seed(1)
    x, first = torch.randn(B, T * CHUNKS, F, generator=gen), starts()
    expected, state = per_step(module, x, first)
    outs = []
    for c in range(CHUNKS):
        chunk = TensorDict({"obs": x[:, c * T:(c + 1) * T], "is_first": first[:, c * T:(c + 1) * T]}, [B, T])
        with set_recurrent_mode(True):
            outs.append(rnn(chunk)["feat"])
        assert "is_init" not in chunk.keys()  # the module's view is private
    torch.testing.assert_close(torch.cat(outs, 1), expected, atol=1e-5, rtol=1e-5)
    for key in rnn.state_keys:
        torch.testing.assert_close(rnn.carried_state[key], state[key], atol=1e-5, rtol=1e-5)


def test_without_the_wrapper_torchrl_restarts_every_chunk():
    """What the wrapper is for: the module alone on the same chunks starts each from zeros."""
    module = torchrl_module("gru")
    x, first = torch.randn(B, T * CHUNKS, F), torch.zeros(B, T * CHUNKS, 1, dtype=torch.bool)
    first[:, 0] = True
    expected, _ = per_step(module, x, first)
    chunk = TensorDict({"obs": x[:, T:2 * T], "is_init": first[:, T:2 * T]}, [B, T])
    with set_recurrent_mode(True):
        alone = module(chunk)["feat"]
    assert (alone - expected[:, T:2 * T]).abs().max() > 1e-3


def test_our_backends_run_its_kernel_alike():
    module = torchrl_module("lstm", layers=2)
    x, first = torch.randn(B, T * CHUNKS, F), starts()
    outputs = {}
    for backend in ("torchrl", "auto", "loop", "fused", "packed"):
        rnn, outs = ResetRNN(module, backend=backend, default_recurrent_mode=True), []
        for c in range(CHUNKS):
            chunk = TensorDict({"obs": x[:, c * T:(c + 1) * T], "is_first": first[:, c * T:(c + 1) * T]}, [B, T])
            outs.append(rnn(chunk)["feat"])
        outputs[backend] = torch.cat(outs, 1)
    for backend in ("auto", "loop", "fused", "packed"):
        torch.testing.assert_close(outputs[backend], outputs["torchrl"], atol=1e-5, rtol=1e-5)


def twin_of(module):
    """ResetRNN on the module's own nn.LSTM with TorchRL's flat keys: an independent path."""
    return ResetRNN(module.lstm, in_key="obs", out_key="feat",
                    state_key=["recurrent_state_h", "recurrent_state_c"], default_recurrent_mode=True)


def test_several_passes_of_a_loss_carry_once():
    """Online pass carries; a second pass over the chunk and a pass over its next view start from
    the chunk's start and leave the carry alone, as ResetRNN on the bare nn.LSTM does."""
    module = torchrl_module("lstm")
    wrapped, twin = ResetRNN(module, default_recurrent_mode=True, backend="torchrl"), twin_of(module)
    x, first = torch.randn(B, T * CHUNKS + 1, F), starts(T * CHUNKS + 1)
    for c in range(CHUNKS):
        s = slice(c * T, (c + 1) * T)
        n = slice(c * T + 1, (c + 1) * T + 1)
        results = []
        for rnn in (wrapped, twin):
            chunk = TensorDict({"obs": x[:, s], "is_first": first[:, s], ("next", "obs"): x[:, n],
                                ("next", "is_first"): first[:, n]}, [B, T])
            online = rnn(chunk)["feat"].clone()
            carry = rnn.carried_state.clone()
            again = rnn(chunk.exclude("feat"))["feat"]
            nxt = rnn(step_mdp(chunk, keep_other=False))["feat"]
            assert (rnn.carried_state == carry).all()
            torch.testing.assert_close(again, online)
            results.append((online, nxt, carry))
        for ours, theirs in zip(*results):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_step_mode_is_torchrl_step_mode():
    module = torchrl_module("lstm", layers=2)
    rnn = ResetRNN(module, backend="torchrl")
    gen = torch.Generator().manual_seed(2)
    state = {k: torch.randn(4, 2, H, generator=gen) for k in module.in_keys[1:-1]}
    is_init = torch.tensor([[True], [False], [False], [True]])
    step = TensorDict({"obs": torch.randn(4, F, generator=gen), "is_init": is_init, **state}, [4])
    with set_recurrent_mode(False):
        ours, theirs, kernel = rnn(step.clone()), module(step.clone()), ResetRNN(module)(step.clone())
    torch.testing.assert_close(ours["feat"], theirs["feat"])
    torch.testing.assert_close(kernel["feat"], theirs["feat"], atol=1e-6, rtol=1e-5)  # ours on its nn.LSTM
    for key in module.in_keys[1:-1]:
        torch.testing.assert_close(ours["next", key], theirs["next", key])
        expected = torch.where(is_init[:, :, None], torch.zeros_like(state[key]), state[key])
        torch.testing.assert_close(ours[key], expected)  # the state it used, as ResetRNN writes it


def test_flat_keys_serve_reset_and_continue_on_windows():
    """Memory an LSTMModule stored when acting serves ResetRNN's reset_state_key as it is, and
    both give TorchRL's recurrent mode on the windows (restart from the stored state at is_init)."""
    module = torchrl_module("lstm")
    gen = torch.Generator().manual_seed(3)
    done = torch.zeros(2, 12, 1, dtype=torch.bool)
    done[0, 3] = done[0, 8] = done[1, 5] = True
    is_init = torch.zeros_like(done)
    is_init[:, 0] = True
    is_init[:, 1:] = done[:, :-1]
    x = torch.randn(2, 12, F, generator=gen)
    _, stored = per_step_states(module, x, is_init)
    rollout = TensorDict({"obs": x, "is_init": is_init, ("next", "done"): done, **stored}, [2, 12])
    windows = make_windows(rollout, 5, memory_key=["recurrent_state_h", "recurrent_state_c"])
    assert (windows["is_init"] == windows["is_first"]).all()
    keys = ["recurrent_state_h", "recurrent_state_c"]
    ours = ResetRNN(module.lstm, in_key="obs", out_key="feat", state_key=keys, reset_state_key=keys,
                    carry=False, default_recurrent_mode=True)(windows.clone())["feat"]
    with set_recurrent_mode(True):
        theirs = module(windows.clone())["feat"]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def per_step_states(module, x, is_init):
    """The state the module had before each step when acting: [E, T, layers, H] per key."""
    keys, states = module.in_keys[1:-1], {}
    state = {k: torch.zeros(x.shape[0], 1, H) for k in keys}
    outs = []
    for t in range(x.shape[1]):
        state = {k: torch.where(is_init[:, t, :, None], torch.zeros_like(v), v) for k, v in state.items()}
        for k in keys:
            states.setdefault(k, []).append(state[k])
        td = TensorDict({"obs": x[:, t], "is_init": is_init[:, t], **state}, [x.shape[0]])
        with set_recurrent_mode(False):
            td = module(td)
        outs.append(td["feat"])
        state = {k: td["next", k] for k in keys}
    return torch.stack(outs, 1), {k: torch.stack(v, 1) for k, v in states.items()}


def test_chunks_carry_is_init_beside_is_first():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(200), sampler=StreamChunkSampler(2, 7, seed=0),
                                batch_size=14)
    done = torch.arange(60).remainder(9).eq(8).unsqueeze(-1)
    stale = torch.zeros(60, 1, dtype=torch.bool)  # a stored is_init is replaced in the chunk
    rb.extend(TensorDict({"obs": torch.arange(60.), "is_init": stale, ("next", "done"): done}, [60]))
    for _ in range(4):
        chunk = rb.sample()
        assert (chunk["is_init"] == chunk["is_first"]).all()
        assert (chunk["is_first"].squeeze(-1) == (chunk["obs"].remainder(9) == 0)).all()


def test_windows_read_is_init_where_is_first_is_absent():
    done = torch.zeros(1, 6, 1, dtype=torch.bool)
    is_init = torch.zeros_like(done)
    is_init[0, 3] = True  # an episode start the done flags do not show (a restarted env)
    rollout = TensorDict({"recurrent_state": torch.zeros(1, 6, 2), "is_init": is_init,
                          ("next", "done"): done}, [1, 6])
    windows = make_windows(rollout, 4)
    assert windows["is_first"].squeeze(-1).tolist() == [[True, False, False, True], [True, False, True, False],
                                                        [True, True, False, False]]
    assert (windows["is_init"] == windows["is_first"]).all()
    plain = make_windows(rollout, 4, init_key=None)  # neither read nor written: kept as stored
    assert plain["is_first"].squeeze(-1).tolist() == [[True, False, False, False]] * 3
    assert plain["is_init"].squeeze(-1).tolist() == [[False, False, False, True], [False, False, True, False],
                                                     [False, True, False, False]]


def test_misuse_names_the_fix():
    module = torchrl_module("lstm")
    with pytest.raises(ValueError, match="drop state_shape"):
        ResetRNN(module, state_shape=(H,))
    with pytest.raises(ValueError, match="backend='torchrl' runs a TorchRL"):
        ResetRNN(nn.GRU(F, H, batch_first=True), backend="torchrl")
    with pytest.raises(ValueError, match=r"lists 1 key\(s\), the state has 2"):
        ResetRNN(nn.LSTM(F, H, batch_first=True), state_key=["recurrent_state_h"])
    with pytest.raises(ValueError, match="bidirectional"):
        ResetRNN(LSTMModule(lstm=nn.LSTM(F, H, batch_first=True, bidirectional=True), in_key="obs", out_key="feat"))
    rnn = ResetRNN(nn.LSTM(F, H, batch_first=True), in_key="obs", reset_state_key="recurrent_state_h",
                   default_recurrent_mode=True)
    data = TensorDict({"obs": torch.randn(2, 4, F), "is_first": torch.ones(2, 4, 1, dtype=torch.bool),
                       "recurrent_state_h": torch.zeros(2, 4, 1, H), "recurrent_state_c": torch.zeros(2, 4, 1, H)},
                      [2, 4])
    with pytest.raises(ValueError, match=r"give a list, e.g. reset_state_key=\['recurrent_state_h'"):
        rnn(data)


def dqn_net(rnn):
    return TensorDictSequential(
        TensorDictModule(nn.Identity(), ["observation"], ["obs"]), rnn,
        TensorDictModule(nn.Linear(H, 2), ["feat"], ["action_value"]))


def test_recurrent_dqn_takes_the_wrapped_module_and_names_the_wrap():
    module = torchrl_module("lstm")
    with pytest.raises(TypeError, match=r"wrap it, rnn = ResetRNN\(module"):
        RecurrentDQNLoss(dqn_net(module), module)
    keys = module.in_keys[1:-1]
    extra = torchrl_module("gru")  # another TorchRL module, unwrapped, in the same network
    rnn = ResetRNN(module, reset_state_key=keys)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RecurrentDQNLoss(dqn_net(rnn), rnn)
        assert not caught  # the wrapped module is carried
        RecurrentDQNLoss(TensorDictSequential(dqn_net(rnn), extra), rnn)
    assert any("restarts every chunk" in str(w.message) and "GRUModule" in str(w.message) for w in caught)


def test_recurrent_dqn_losses_equal_on_the_module_and_its_kernel():
    """The same weights through ResetRNN(LSTMModule) (TorchRL's backend) and ResetRNN(nn.LSTM)
    with TorchRL's keys (ours): the same losses chunk after chunk, carries and targets included."""
    gen = torch.Generator().manual_seed(4)
    steps = 90
    done = (torch.rand(steps, 1, generator=gen) < 0.12)
    obs = torch.randn(steps + 1, F, generator=gen)
    data = TensorDict({"observation": obs[:-1], ("next", "observation"): obs[1:],
                       "action": torch.randint(2, (steps,), generator=gen),
                       ("next", "reward"): torch.randn(steps, 1, generator=gen),
                       ("next", "done"): done, ("next", "terminated"): done & (torch.rand(steps, 1, generator=gen) < .5)},
                      [steps])
    data["next", "truncated"] = data["next", "done"] & ~data["next", "terminated"]
    module = torchrl_module("lstm")
    keys = module.in_keys[1:-1]
    losses = []
    for make in (lambda m: ResetRNN(m, reset_state_key=keys, backend="torchrl"),
                 lambda m: ResetRNN(m.lstm, in_key="obs", out_key="feat", state_key=keys, reset_state_key=keys)):
        torch.manual_seed(5)
        rnn = make(copy.deepcopy(module))
        torch.manual_seed(6)
        net = dqn_net(rnn)
        loss = RecurrentDQNLoss(net, rnn, action_space="categorical", n_steps=2)
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(steps), sampler=StreamChunkSampler(3, 8, seed=0),
                                    batch_size=24)
        rb.extend(data)
        losses.append(torch.stack([loss(rb.sample())["loss"] for _ in range(5)]))
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("where", ["gae", "nstep"])
def test_boundaries_read_is_init_where_is_first_is_absent(where):
    """A restart that only is_init shows (no done before it) stops the recursion as is_first does."""
    from torchrl_seqchunk import boundary_gae, boundary_nstep_targets

    flags = torch.zeros(1, 6, 1, dtype=torch.bool)
    flags[0, 3] = True
    base = TensorDict({"state_value": torch.ones(1, 6, 1), ("next", "state_value"): torch.ones(1, 6, 1),
                       ("next", "reward"): torch.ones(1, 6, 1), ("next", "done"): torch.zeros(1, 6, 1, dtype=torch.bool)},
                      [1, 6])
    run = ((lambda td: boundary_gae(td, gamma=0.5, lmbda=1.0)["advantage"]) if where == "gae"
           else (lambda td: boundary_nstep_targets(td, gamma=0.5, n_steps=6)["value_target"]))
    with_first = run(base.clone().set("is_first", flags))
    with_init = run(base.clone().set("is_init", flags))
    torch.testing.assert_close(with_init, with_first)
    assert not torch.equal(run(base.clone()), with_first)  # the flag matters here


def test_the_modules_own_mode_backend_limits_and_keys_are_kept():
    """Found by an attack: each was silent or a foreign error before."""
    module = LSTMModule(input_size=F, hidden_size=H, in_key="obs", out_key="feat", default_recurrent_mode=True)
    assert ResetRNN(module).default_recurrent_mode is True  # the module's own mode
    python_based = torchrl_module("lstm", python_based=True)
    with pytest.raises(ValueError, match="pass backend='torchrl'"):
        ResetRNN(python_based, backend="loop")
    with pytest.raises(ValueError, match="python_based=False"):
        ResetRNN(LSTMModule(input_size=F, hidden_size=H, proj_size=2, python_based=True, in_key="obs", out_key="feat"))
    custom = GRUModule(input_size=F, hidden_size=H, in_keys=["obs", "h", "is_init"], out_keys=["feat", "h_out"])
    with set_recurrent_mode(False):
        step = ResetRNN(custom)(TensorDict({"obs": torch.randn(2, F), "is_init": torch.ones(2, 1, dtype=torch.bool)}, [2]))
    assert "h_out" in step.keys()  # the module's own out key for the next state


def test_proj_size_steps_and_a_bad_stored_state_is_named():
    module = LSTMModule(input_size=F, hidden_size=H, proj_size=3, in_key="obs", out_key="feat")
    step = TensorDict({"obs": torch.randn(2, F), "is_init": torch.tensor([[True], [False]]),
                       "recurrent_state_h": torch.randn(2, 1, 3), "recurrent_state_c": torch.randn(2, 1, H)}, [2])
    with set_recurrent_mode(False):
        torchrl_pick, ours = ResetRNN(module, backend="torchrl")(step.clone()), ResetRNN(module)(step.clone())
    torch.testing.assert_close(torchrl_pick["feat"], ours["feat"])
    rnn = ResetRNN(torchrl_module("gru"), backend="torchrl", reset_state_key="recurrent_state", default_recurrent_mode=True)
    bad = TensorDict({"obs": torch.randn(2, 4, F), "is_first": torch.ones(2, 4, 1, dtype=torch.bool),
                      "recurrent_state": torch.zeros(2, 4, H)}, [2, 4])  # no layer dim
    with pytest.raises(ValueError, match="reset_state entries must be"):
        rnn(bad)


def test_windows_reset_where_either_stored_flag_starts_an_episode():
    done = torch.zeros(1, 6, 1, dtype=torch.bool)
    is_first, is_init = torch.zeros_like(done), torch.zeros_like(done)
    is_first[0, 2], is_init[0, 4] = True, True
    rollout = TensorDict({"recurrent_state": torch.zeros(1, 6, 2), "is_first": is_first, "is_init": is_init,
                          ("next", "done"): done}, [1, 6])
    assert make_windows(rollout, 6)["is_first"].squeeze(-1).tolist() == [[True, False, True, False, True, False]]
