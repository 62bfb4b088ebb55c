"""Tests for torchrl_seqchunk.recurrent: every backend against a per-step reference loop."""
import contextlib
import copy
import functools
import warnings

import pytest
import torch
from tensordict import TensorDict, unravel_key
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import set_recurrent_mode

from torchrl_seqchunk import MinGRUCell, ResetRNN, rnn_with_resets
from torchrl_seqchunk.recurrent import backends as recurrent

B, T, F, H = 5, 9, 3, 4


# --------------------------------------------------------------------------- helpers
class TupleCell(nn.Module):
    """An RSSM-like cell with a tuple state (deterministic h, latent z)."""

    def __init__(self, input_size, hidden, latent):
        super().__init__()
        self.gru = nn.GRUCell(input_size + latent, hidden)
        self.post = nn.Linear(hidden, latent)

    def forward(self, x, state):
        h, z = state
        h = self.gru(torch.cat([x, z], -1), h)
        return h, torch.tanh(self.post(h))


class RSSMCell(nn.Module):
    """An RSSM-like cell whose state is a TensorDict: deterministic "deter", latent `stoch_key`."""

    def __init__(self, input_size, hidden, latent, stoch_key="stoch"):
        super().__init__()
        self.stoch_key = stoch_key
        self.gru = nn.GRUCell(input_size + latent, hidden)
        self.post = nn.Linear(hidden + input_size, latent)

    def forward(self, x, state):
        deter = self.gru(torch.cat([x, state[self.stoch_key]], -1), state["deter"])
        stoch = torch.tanh(self.post(torch.cat([deter, x], -1)))
        # keys in another order than the state's: entries are matched by key
        return TensorDict({self.stoch_key: stoch, "deter": deter}, state.batch_size)


class PairCell(nn.Module):
    """Two minGRUs side by side, state TensorDict {"fast": [H], "slow": [2]}: still linear."""

    def __init__(self, input_size, hidden):
        super().__init__()
        self.cells = nn.ModuleDict(
            {"fast": MinGRUCell(input_size, hidden), "slow": MinGRUCell(input_size, 2)}
        )

    def forward(self, x, state):
        return TensorDict({k: c(x, state[k]) for k, c in self.cells.items()}, state.batch_size)

    def linear_coefficients(self, x):
        a, b = zip(*(c.linear_coefficients(x) for c in self.cells.values()))
        return tuple(TensorDict(dict(zip(self.cells, v)), x.shape[:-1]) for v in (a, b))


class Accumulator(nn.Module):
    """h_t = h_{t-1} + x_t (the wrapper does the resetting); also a linear recurrence."""

    hidden_size = 1

    def forward(self, x, h):
        return h + x

    def linear_coefficients(self, x):
        return torch.ones_like(x), x


def make_rnn(kind):
    return {
        "gru2": lambda: nn.GRU(F, H, num_layers=2),  # time-first, to check batch_first
        "lstm2": lambda: nn.LSTM(F, H, num_layers=2, batch_first=True),
        "lstm_proj": lambda: nn.LSTM(F, H, batch_first=True, proj_size=2),
        "grucell": lambda: nn.GRUCell(F, H),
        "lstmcell": lambda: nn.LSTMCell(F, H),
        "tuplecell": lambda: TupleCell(F, H, 2),
        "mingru": lambda: MinGRUCell(F, H),
        "rssm": lambda: RSSMCell(F, H, 2),
        "rssm_nested": lambda: RSSMCell(F, H, 2, stoch_key=("latent", "stoch")),
        "pair": lambda: PairCell(F, H),
    }[kind]()


# ResetRNN's state_shape of the custom cells (TensorDict states: entry name -> shape)
STATE_SHAPE = {
    "tuplecell": ((H,), (2,)),
    "rssm": {"deter": (H,), "stoch": (2,)},
    "rssm_nested": {"deter": (H,), ("latent", "stoch"): (2,)},
    "pair": {"fast": (H,), "slow": (2,)},
}


def state_shapes(rnn):
    if isinstance(rnn, nn.GRU):
        return [(rnn.num_layers, H)]
    if isinstance(rnn, nn.LSTM):
        return [(rnn.num_layers, rnn.proj_size or H), (rnn.num_layers, H)]
    if isinstance(rnn, nn.LSTMCell):
        return [(H,), (H,)]
    if isinstance(rnn, TupleCell):
        return [(H,), (2,)]
    return [(H,)]


def reference(rnn, x, is_first, h0, reset_state):
    """Per-step loop: replace the state where is_first, then one native step."""
    stacked = isinstance(rnn, nn.RNNBase)
    state = list(h0)
    ys = []
    for t in range(x.shape[1]):
        for i, s in enumerate(state):
            m = is_first[:, t].reshape(-1, *([1] * (s.dim() - 1)))
            state[i] = torch.where(m, reset_state[i][:, t], s)
        if stacked:  # the whole stack for one step, native layout [layers, B, H]
            native = tuple(s.transpose(0, 1).contiguous() for s in state)
            x_t = x[:, t : t + 1] if rnn.batch_first else x[:, t].unsqueeze(0)
            y, new = rnn(x_t, native[0] if len(native) == 1 else native)
            new = (new,) if isinstance(new, torch.Tensor) else new
            state = [s.transpose(0, 1) for s in new]
            ys.append(y.reshape(x.shape[0], -1))
        else:
            new = rnn(x[:, t], state[0] if len(state) == 1 else tuple(state))
            state = [new] if isinstance(new, torch.Tensor) else list(new)
            ys.append(state[0])
    return torch.stack(ys, 1), state


def td_state(kind, *batch, make=torch.randn, **kwargs):
    """A TensorDict state of a TensorDict-state cell, batch `batch`."""
    entries = {key: make(*batch, *shape, **kwargs) for key, shape in STATE_SHAPE[kind].items()}
    return TensorDict(entries, batch)


def td_reference(cell, x, is_first, h0, reset_state):
    """Per-step loop on TensorDicts: torch.where takes the reset value, then one cell step."""
    state, ys = h0, []
    for t in range(x.shape[1]):
        state = cell(x[:, t], torch.where(is_first[:, t], reset_state[:, t], state))
        ys.append(state)
    return torch.stack(ys, 1), state


def features(y):
    """A tensor output as is; a TensorDict output as its entries side by side, by key."""
    if isinstance(y, torch.Tensor):
        return y
    return torch.cat([y[k] for k in sorted(y.keys(True, True), key=str)], -1)


def random_flags(rate=0.25):
    is_first = torch.rand(B, T) < rate
    is_first[0, 0] = True  # reset at t = 0
    is_first[1, 3:5] = True  # consecutive resets
    is_first[2, 0] = False
    return is_first


def loss_of(y, h_last):
    torch.manual_seed(1)
    total = (y * torch.randn(y.shape)).sum()  # randn_like would follow the strides
    for h in h_last:
        total = total + (h * torch.randn(h.shape)).sum()
    return total


def grads(loss, tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True)


# --------------------------------------------------------------------------- backends
CASES = [
    ("gru2", "loop"), ("gru2", "packed"), ("gru2", "fused"),
    ("lstm2", "loop"), ("lstm2", "packed"), ("lstm2", "fused"),
    ("lstm_proj", "loop"), ("lstm_proj", "packed"),
    ("grucell", "loop"), ("lstmcell", "loop"), ("tuplecell", "loop"),
    ("mingru", "loop"), ("mingru", "scan"),
]


def sparse_flags():
    """Resets on two time steps only: the loop backend runs native reset-free segments."""
    is_first = torch.zeros(B, T, dtype=torch.bool)
    is_first[0, 0] = is_first[1, 5] = is_first[3, 5] = True
    assert len(recurrent._segment_bounds(is_first)) - 1 == 2 and 4 * 2 <= T
    return is_first


@pytest.mark.parametrize("flags", [random_flags, sparse_flags], ids=["dense", "sparse"])
@pytest.mark.parametrize("stored", [False, True], ids=["zeros", "stored"])
@pytest.mark.parametrize("kind,backend", CASES)
@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN:UserWarning")
def test_backend_matches_reference(kind, backend, stored, flags):
    rnn = make_rnn(kind)
    shapes = state_shapes(rnn)
    x = torch.randn(B, T, F, requires_grad=True)
    h0 = tuple(torch.randn(B, *s, requires_grad=True) for s in shapes)
    if stored:
        resets = tuple(torch.randn(B, T, *s, requires_grad=True) for s in shapes)
    else:
        resets = tuple(torch.zeros(B, T, *s) for s in shapes)
    is_first = flags()
    leaves = [x, *h0, *list(rnn.parameters())] + ([*resets] if stored else [])

    y_ref, h_ref = reference(rnn, x, is_first, h0, resets)
    g_ref = grads(loss_of(y_ref, h_ref), leaves)

    pack = (lambda s: s) if len(shapes) > 1 else (lambda s: s[0])
    y, h_last = rnn_with_resets(
        rnn, x, is_first.unsqueeze(-1), pack(h0), pack(resets) if stored else None, backend=backend
    )
    h_last = h_last if len(shapes) > 1 else (h_last,)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=0)
    for h, r in zip(h_last, h_ref):
        torch.testing.assert_close(h, r, atol=1e-5, rtol=0)
    for g, r in zip(grads(loss_of(y, h_last), leaves), g_ref):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=0)


@pytest.mark.parametrize("stored", [False, True], ids=["zeros", "stored"])
@pytest.mark.parametrize(
    "kind,backend", [("rssm", "loop"), ("rssm_nested", "loop"), ("pair", "loop"), ("pair", "scan")]
)
def test_tensordict_state_matches_reference(kind, backend, stored):
    cell = make_rnn(kind)
    x = torch.randn(B, T, F, requires_grad=True)
    h0 = td_state(kind, B, requires_grad=True)
    make = torch.randn if stored else torch.zeros
    resets = td_state(kind, B, T, make=make, requires_grad=stored)
    is_first = random_flags()
    leaves = [x, *h0.values(True, True), *cell.parameters()]
    leaves += list(resets.values(True, True)) if stored else []

    y_ref, h_ref = td_reference(cell, x, is_first, h0, resets)
    g_ref = grads(loss_of(features(y_ref), [features(h_ref)]), leaves)

    y, h_last = rnn_with_resets(
        cell, x, is_first.unsqueeze(-1), h0, resets if stored else None, backend=backend
    )
    assert isinstance(y, TensorDict) and y.batch_size == (B, T) and h_last.batch_size == (B,)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(h_last, h_ref, atol=1e-5, rtol=0)
    for g, r in zip(grads(loss_of(features(y), [features(h_last)]), leaves), g_ref):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=0)


def test_no_gradient_through_a_reset():
    rnn = nn.GRU(F, H, batch_first=True)
    x = torch.randn(1, 4, F, requires_grad=True)
    is_first = torch.tensor([[0, 0, 1, 0]])
    y, _ = rnn_with_resets(rnn, x, is_first)
    (grad,) = torch.autograd.grad(y[:, 2:].sum(), x)
    assert grad[:, :2].abs().sum() == 0 and grad[:, 2:].abs().sum() > 0


@pytest.mark.parametrize("backend", ["loop", "scan"])
def test_accumulator_by_hand(backend):
    x = torch.tensor([[1.0, 1, 1, 2, 2], [1, 1, 1, 1, 1]]).unsqueeze(-1)
    is_first = torch.tensor([[0, 0, 0, 1, 0], [1, 0, 1, 0, 0]], dtype=torch.bool)
    y, h_last = rnn_with_resets(Accumulator(), x, is_first, backend=backend)
    assert y.squeeze(-1).tolist() == [[1, 2, 3, 2, 4], [1, 2, 1, 2, 3]]
    assert h_last.squeeze(-1).tolist() == [4, 3]


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32])
def test_integer_flags_reset_only_the_flagged_row(dtype):
    rnn = nn.GRU(F, H, batch_first=True)
    x = torch.randn(4, 3, F)
    h0 = torch.randn(4, 1, H)
    is_first = torch.zeros(4, 3, dtype=dtype)
    is_first[:, 1] = torch.tensor([0, 0, 1, 0]).to(dtype)  # read as flags, never as an index
    y, _ = rnn_with_resets(rnn, x, is_first, h0)
    y_carry, _ = rnn_with_resets(rnn, x, torch.zeros(4, 3), h0)
    y_fresh, _ = rnn_with_resets(rnn, x[:, 1:], torch.zeros(4, 2))
    torch.testing.assert_close(y[[0, 1, 3]], y_carry[[0, 1, 3]])
    torch.testing.assert_close(y[2, 1:], y_fresh[2])
    assert not torch.allclose(y[2, 1:], y_carry[2, 1:])


def test_auto_picks_scan_for_linear_recurrences_fused_for_small_gru_batches_and_dense_lstm_resets():
    device = torch.device("cpu")
    dense = torch.zeros(B, T, dtype=torch.bool)
    dense[0, ::2] = True  # a reset on every other step: T / 2 + 1 segments
    sparse = sparse_flags()  # resets on two steps: native segments
    flags = lambda rows: torch.zeros(rows, T, dtype=torch.bool)  # noqa: E731
    assert recurrent._pick_backend(MinGRUCell(F, H), device, dense) == "scan"
    assert recurrent._pick_backend(nn.GRU(F, 64), device, flags(8)) == "fused"  # the main job's size
    assert recurrent._pick_backend(nn.GRU(F, 1024), device, flags(32)) == "fused"  # B = 32, any H
    assert recurrent._pick_backend(nn.GRU(F, 64), device, flags(64)) == "fused"  # B * H = 4096
    assert recurrent._pick_backend(nn.GRU(F, 128), device, flags(64)) == "loop"  # past both
    assert recurrent._pick_backend(nn.LSTM(F, H), device, dense) == "fused"
    assert recurrent._pick_backend(nn.LSTM(F, H), device, sparse) == "loop"
    assert recurrent._pick_backend(nn.LSTM(F, H, proj_size=2), device, dense) == "loop"  # not fusable
    assert recurrent._pick_backend(nn.GRU(F, H), torch.device("cuda"), dense) == "packed"
    assert recurrent._pick_backend(nn.GRU(F, 64), torch.device("meta"), flags(8)) == "loop"  # measured on CPU only
    assert recurrent._pick_backend(nn.LSTM(F, H), torch.device("meta"), dense) == "loop"
    assert recurrent._pick_backend(make_rnn("pair"), device, dense) == "scan"
    assert recurrent._pick_backend(make_rnn("rssm"), device, dense) == "loop"


def test_under_no_grad():
    rnn = nn.LSTM(F, H, batch_first=True)
    x, is_first = torch.randn(B, T, F), random_flags()
    y_ref, _ = rnn_with_resets(rnn, x, is_first, backend="loop")
    for backend in ("loop", "packed", "fused"):
        with torch.no_grad():
            y, (h, c) = rnn_with_resets(rnn, x, is_first, backend=backend)
        assert y.grad_fn is None and h.grad_fn is None
        torch.testing.assert_close(y, y_ref.detach(), atol=1e-6, rtol=0)
    module = ResetRNN(MinGRUCell(F, H), default_recurrent_mode=True)
    with torch.no_grad():
        out = module(TensorDict({"embed": x, "is_first": is_first}, [B, T]))
    assert out["features"].grad_fn is None and module._carry[0].shape == (B, H)


@pytest.mark.parametrize("kind,backend", [("gru2", "loop"), ("gru2", "fused"), ("mingru", "scan")])
def test_under_torch_compile(kind, backend):
    rnn = make_rnn(kind)
    x, is_first = torch.randn(B, T, F), random_flags()
    compiled = torch.compile(
        lambda x, f: rnn_with_resets(rnn, x, f, backend=backend)[0], backend="aot_eager"
    )
    torch.testing.assert_close(compiled(x, is_first), rnn_with_resets(rnn, x, is_first)[0])


# --------------------------------------------------------------------------- errors
def test_bad_inputs_raise_clear_errors():
    gru = nn.GRU(F, H, batch_first=True)
    x = torch.randn(B, T, F)
    with pytest.raises(ValueError, match="is_first"):
        rnn_with_resets(gru, x, torch.zeros(B, T, 2))
    with pytest.raises(ValueError, match="x must be"):
        rnn_with_resets(gru, x[0], torch.zeros(T))
    with pytest.raises(ValueError, match="h0"):
        rnn_with_resets(gru, x, torch.zeros(B, T), torch.zeros(1, B, H))
    with pytest.raises(ValueError, match="reset_state"):
        rnn_with_resets(gru, x, torch.zeros(B, T), None, torch.zeros(B, T, H))
    with pytest.raises(ValueError, match="backend"):
        rnn_with_resets(gru, x, torch.zeros(B, T), backend="fast")
    with pytest.raises(TypeError, match="linear_coefficients"):
        rnn_with_resets(gru, x, torch.zeros(B, T), backend="scan")
    with pytest.raises(TypeError, match="packed"):
        rnn_with_resets(nn.GRUCell(F, H), x, torch.zeros(B, T), backend="packed")
    for rnn in (nn.GRUCell(F, H), nn.LSTM(F, H, proj_size=2, batch_first=True)):
        with pytest.raises(TypeError, match="fused"):
            rnn_with_resets(rnn, x, torch.zeros(B, T), backend="fused")
    with pytest.raises(ValueError, match="bidirectional"):
        rnn_with_resets(nn.GRU(F, H, bidirectional=True), x, torch.zeros(B, T))
    with pytest.raises(TypeError, match="nn.GRU, nn.LSTM"):
        ResetRNN(nn.RNN(F, H))
    with pytest.raises(ValueError, match="state_shape"):
        ResetRNN(TupleCell(F, H, 2))
    with pytest.raises(ValueError, match="initial_state"):
        ResetRNN(gru, initial_state="random")

    # TensorDict states: every state has the same keys; scan needs a linear cell
    rssm, h0, no_reset = make_rnn("rssm"), td_state("rssm", B), torch.zeros(B, T)
    with pytest.raises(ValueError, match=r"reset_state must hold exactly the entries"):
        rnn_with_resets(rssm, x, no_reset, h0, h0.exclude("stoch").unsqueeze(1))
    with pytest.raises(TypeError, match=r"reset_state must be a TensorDict"):
        rnn_with_resets(rssm, x, no_reset, h0, (h0["deter"], h0["stoch"]))

    class ForgetsStoch(nn.Module):
        def forward(self, x, h):
            return h.exclude("stoch")

    with pytest.raises(ValueError, match=r"the output of ForgetsStoch must hold exactly"):
        rnn_with_resets(ForgetsStoch(), x, no_reset, h0)
    with pytest.raises(TypeError, match="linear_coefficients"):
        rnn_with_resets(rssm, x, no_reset, h0, backend="scan")
    with pytest.raises(TypeError, match="packed"):
        rnn_with_resets(rssm, x, no_reset, h0, backend="packed")
    with pytest.raises(ValueError, match=r"state_shape must be .*dict of shapes"):
        ResetRNN(rssm, state_shape={"deter": "H"})
    # a negative or bool size failed at the first call ("zeros: Dimension size must be non-negative")
    for bad in [(-2,), ((3,), (-1,)), {"deter": (-1,)}, (True,)]:
        with pytest.raises(ValueError, match=r"state_shape must be a shape like \(H,\) \(non-negative ints\)"):
            ResetRNN(rssm, state_shape=bad)


# --------------------------------------------------------------------------- ResetRNN
def chunk(x, is_first, **extra):
    return TensorDict({"embed": x, "is_first": is_first.unsqueeze(-1), **extra}, x.shape[:2])


@pytest.mark.parametrize("reset_at_start", [False, True])
@pytest.mark.parametrize("kind", ["gru2", "lstm2", "mingru", "rssm"])
def test_carry_equals_one_long_call(kind, reset_at_start):
    rnn = make_rnn(kind)
    x, is_first = torch.randn(B, 2 * T, F), torch.rand(B, 2 * T) < 0.1
    is_first[:, T] = reset_at_start
    whole = ResetRNN(rnn, state_shape=STATE_SHAPE.get(kind), default_recurrent_mode=True)
    y_whole = whole(chunk(x, is_first))["features"]
    split = ResetRNN(rnn, state_shape=STATE_SHAPE.get(kind), default_recurrent_mode=True)
    y_first = split(chunk(x[:, :T], is_first[:, :T]))["features"]
    saved = split.state_dict()
    y_second = split(chunk(x[:, T:], is_first[:, T:]))["features"]
    torch.testing.assert_close(torch.cat([y_first, y_second], 1), y_whole)
    for c_split, c_whole in zip(split._carry, whole._carry):
        torch.testing.assert_close(c_split, c_whole)
        assert c_split.grad_fn is None  # truncated BPTT

    resumed = ResetRNN(rnn, state_shape=STATE_SHAPE.get(kind), default_recurrent_mode=True)
    resumed.load_state_dict(saved)
    torch.testing.assert_close(resumed(chunk(x[:, T:], is_first[:, T:]))["features"], y_second)


def test_carry_off_starts_every_call_fresh_and_reset_carry_by_row():
    rnn = nn.GRU(F, H, batch_first=True)
    x, no_reset = torch.randn(B, T, F), torch.zeros(B, T, dtype=torch.bool)
    fresh = rnn_with_resets(rnn, x, no_reset)[0]
    module = ResetRNN(rnn, carry=False, default_recurrent_mode=True)
    module(chunk(x, no_reset))
    torch.testing.assert_close(module(chunk(x, no_reset))["features"], fresh)
    assert module._carry is None

    module = ResetRNN(rnn, default_recurrent_mode=True)
    module(chunk(x, no_reset))
    module.reset_carry(torch.tensor([1, 0, 0, 0, 1]))
    y = module(chunk(x, no_reset))["features"]
    torch.testing.assert_close(y[[0, 4]], fresh[[0, 4]])
    assert not torch.allclose(y[1:4], fresh[1:4])
    module.reset_carry()
    torch.testing.assert_close(module(chunk(x, no_reset))["features"], fresh)


def test_batch_change_needs_resets_or_reset_carry():
    module = ResetRNN(nn.GRU(F, H, batch_first=True), default_recurrent_mode=True)
    module(chunk(torch.randn(B, T, F), torch.zeros(B, T, dtype=torch.bool)))
    with pytest.raises(ValueError, match="reset_carry"):
        module(chunk(torch.randn(3, T, F), torch.zeros(3, T, dtype=torch.bool)))
    starts = torch.zeros(3, T, dtype=torch.bool)
    starts[:, 0] = True
    assert module(chunk(torch.randn(3, T, F), starts))["features"].shape == (3, T, H)


def test_leading_batch_dims_are_rows():
    rnn = nn.GRU(F, H, batch_first=True)
    x, is_first = torch.randn(2, 3, T, F), torch.rand(2, 3, T) < 0.2
    td = TensorDict({"embed": x, "is_first": is_first}, [2, 3, T])
    y = ResetRNN(rnn, carry=False, default_recurrent_mode=True)(td)["features"]
    y_ref, _ = rnn_with_resets(rnn, x.reshape(6, T, F), is_first.reshape(6, T))
    torch.testing.assert_close(y, y_ref.reshape(2, 3, T, H))


def test_learned_initial_state_is_used_at_resets_and_trained():
    module = ResetRNN(nn.GRUCell(F, H), initial_state="learned", carry=False, default_recurrent_mode=True)
    with torch.no_grad():
        module.initial[0].copy_(torch.randn(H))
    x, is_first = torch.randn(B, T, F), random_flags()
    y = module(chunk(x, is_first))["features"]
    start = module.initial[0].detach().expand(B, T, H)
    y_ref, _ = reference(module.rnn, x, is_first, (start[:, 0],), (start,))
    torch.testing.assert_close(y, y_ref)
    (grad,) = torch.autograd.grad(y.sum(), module.initial[0])
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["gru2", "lstm2", "tuplecell", "rssm_nested"])
def test_step_mode_writes_used_and_next_state_and_matches_sequence_mode(kind):
    rnn = make_rnn(kind)
    module = ResetRNN(rnn, state_shape=STATE_SHAPE.get(kind), carry=False)
    if kind == "lstm2":
        assert module.state_keys == [("recurrent_state", "h"), ("recurrent_state", "c")]
    if kind == "rssm_nested":
        stoch = ("recurrent_state", "latent", "stoch")
        assert module.state_keys == [("recurrent_state", "deter"), stoch]
    next_keys = [k for k in module.out_keys if isinstance(k, tuple) and k[0] == "next"]
    x, flags = torch.randn(B, T, F), random_flags()
    flags[:, 0] = flags[:, 3] = True
    outputs, previous = [], None
    for t in range(T):
        td = TensorDict({"embed": x[:, t], "is_first": flags[:, t, None]}, [B])
        if previous is not None:  # what step_mdp does: the next state becomes the root state
            for key, value in zip(module.state_keys, previous):
                td.set(key, torch.randn_like(value) if t == 3 else value)  # t = 3 resets all
        td = module(td)
        reset = flags[:, t]
        for i, key in enumerate(module.state_keys):
            used = td.get(key)
            assert used[reset].abs().sum() == 0  # reset rows used the zero state
            if previous is not None:
                torch.testing.assert_close(used[~reset], previous[i][~reset])
        previous = [td.get(k) for k in next_keys]
        outputs.append(td["features"])
    with set_recurrent_mode(True):
        y_seq = module(chunk(x, flags))["features"]
    torch.testing.assert_close(torch.stack(outputs, 1), y_seq)


def test_step_mode_without_state_or_batch_dims():
    module = ResetRNN(nn.LSTMCell(F, H))
    td = module(TensorDict({"embed": torch.randn(F), "is_first": torch.ones(1, dtype=torch.bool)}, []))
    assert td["features"].shape == (H,)
    assert td["recurrent_state", "h"].abs().sum() == 0  # no state in the input: zeros
    assert td["next", "recurrent_state", "c"].shape == (H,)


# the keys each layout writes: output entries (both modes), state entries used and next
# (step mode only)
WRITTEN = {
    "gru2": (["features"], ["recurrent_state", ("next", "recurrent_state")]),
    "lstm2": (["features"], [("recurrent_state", "h"), ("recurrent_state", "c"),
                             ("next", "recurrent_state", "h"), ("next", "recurrent_state", "c")]),
    "rssm_nested": (
        [("features", "deter"), ("features", "latent", "stoch")],
        [("recurrent_state", "deter"), ("recurrent_state", "latent", "stoch"),
         ("next", "recurrent_state", "deter"), ("next", "recurrent_state", "latent", "stoch")],
    ),
}


@pytest.mark.parametrize("how", ["inferred", "context"])
@pytest.mark.parametrize("kind", list(WRITTEN))
def test_out_keys_list_exactly_what_each_mode_writes(kind, how):
    module = ResetRNN(make_rnn(kind), state_shape=STATE_SHAPE.get(kind))
    outputs, states = WRITTEN[kind]
    step = TensorDict({"embed": torch.randn(B, F), "is_first": torch.ones(B, 1, dtype=torch.bool)}, [B])
    # a carrying pass also marks the chunk: its start state, at the root and for the next view
    marks = ["recurrent_state_start_by", "recurrent_state_start_t", *module.start_keys]
    marks += [("next", *k) if isinstance(k, tuple) else ("next", k) for k in marks]
    marks += [("next", "is_first")]
    for td, sequence, expected in [
        (chunk(torch.randn(B, T, F), random_flags()), True, outputs + marks),
        (step, False, outputs + states),
        (chunk(torch.randn(B, T, F), random_flags()), True, outputs + marks),  # and back
    ]:
        given = set(td.keys(True, True))
        mode = set_recurrent_mode(sequence) if how == "context" else contextlib.nullcontext()
        with mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an inferred sequence mode warns
            out = module(td.clone())
            keys = module.out_keys
        assert keys == expected
        assert set(out.select(*keys).keys(True, True)) == set(expected)  # every key is there
        assert set(out.keys(True, True)) - given <= set(expected)  # nothing else is written


# how step mode is said: the module's default, TorchRL's context, the context over a default
STEP_MODE = {"default": (False, False), "context": (None, True), "override": (True, True)}


@pytest.mark.parametrize("how", list(STEP_MODE))
@pytest.mark.parametrize("kind", ["gru2", "lstmcell"])
def test_step_mode_on_a_multi_dim_env_batch_steps_every_env(kind, how):
    """An env batch [2, 3] in step mode: 6 envs, each one step per call, as a per-step loop."""
    rnn = make_rnn(kind)
    default, in_context = STEP_MODE[how]
    module = ResetRNN(rnn, default_recurrent_mode=default)
    mode = set_recurrent_mode(False) if in_context else contextlib.nullcontext()
    steps = 5
    x, flags = torch.randn(2, 3, steps, F), torch.rand(2, 3, steps) < 0.3
    flags[..., 0] = True
    next_keys = [unravel_key(("next", k)) for k in module.state_keys]
    outputs, previous = [], None
    for t in range(steps):
        td = TensorDict({"embed": x[:, :, t], "is_first": flags[:, :, t, None]}, [2, 3])
        for key, value in zip(module.state_keys, previous or []):
            td.set(key, value)  # what step_mdp does
        with mode, warnings.catch_warnings():
            warnings.simplefilter("error")  # no mode is inferred here
            td = module(td)
        previous = [td.get(k) for k in next_keys]
        outputs.append(td["features"])
    zeros = [torch.zeros(6, steps, *s) for s in state_shapes(rnn)]
    x_ref, flags_ref = x.reshape(6, steps, F), flags.reshape(6, steps)
    y_ref, _ = reference(rnn, x_ref, flags_ref, [z[:, 0] for z in zeros], zeros)
    torch.testing.assert_close(torch.stack(outputs, 2), y_ref.reshape(2, 3, steps, H))


def test_inferred_sequence_mode_warns_once_and_a_stated_mode_does_not():
    def batch():  # [2, 3]: 2 sequences of 3 steps, or an env batch
        return chunk(torch.randn(2, 3, F), torch.zeros(2, 3, dtype=torch.bool))

    module = ResetRNN(nn.GRUCell(F, H))
    with pytest.warns(UserWarning, match=r"batch \[2, 3\] in sequence mode .*set_recurrent_mode"):
        module(batch())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module(batch())  # once per module
        ResetRNN(nn.GRUCell(F, H), default_recurrent_mode=True)(batch())
        with set_recurrent_mode(True):
            ResetRNN(nn.GRUCell(F, H))(batch())
        step = TensorDict({"embed": torch.randn(2, F), "is_first": torch.ones(2, 1, dtype=torch.bool)}, [2])
        ResetRNN(nn.GRUCell(F, H))(step)  # step mode for one batch dim, as TorchRL's default
    with pytest.raises(TypeError, match=r"default_recurrent_mode must be True .* got 1"):
        ResetRNN(nn.GRUCell(F, H), default_recurrent_mode=1)
    with pytest.raises(ValueError, match=r"sequence mode needs a time dim .* batch \[\]"):
        ResetRNN(nn.GRUCell(F, H), default_recurrent_mode=True)(step[0])


@pytest.mark.parametrize("kind", ["gru2", "rssm"])
def test_reset_state_from_the_batch_reproduces_the_rollout(kind):
    """Windows of 4 slots with stored memory at each window start reproduce the rollout."""
    rnn = make_rnn(kind)
    actor = ResetRNN(rnn, state_shape=STATE_SHAPE.get(kind))
    steps = 12
    x, is_first = torch.randn(2, steps, F), torch.zeros(2, steps, dtype=torch.bool)
    is_first[:, 0] = True
    is_first[0, 6] = True
    stored, outputs = [], []
    state = None
    with torch.no_grad():
        for t in range(steps):
            td = TensorDict({"embed": x[:, t], "is_first": is_first[:, t, None]}, [2])
            if state is not None:
                td["recurrent_state"] = state
            td = actor(td)
            stored.append(td["recurrent_state"])
            outputs.append(td["features"])
            state = td["next", "recurrent_state"]
    stored, outputs = torch.stack(stored, 1), torch.stack(outputs, 1)  # [2, steps, *S]

    width = 4
    starts = range(steps - width + 1)

    def cut(values):  # [2, steps, ...] -> [2 * len(starts), width, ...]
        return torch.stack([values[:, s : s + width] for s in starts], 1).flatten(0, 1)

    windows = TensorDict(
        {"embed": cut(x), "is_first": cut(is_first), "recurrent_state": cut(stored)},
        [2 * len(starts), width],
    )
    windows["is_first"][:, 0] = True  # every window starts from its stored memory
    expected = cut(outputs)
    shape = STATE_SHAPE.get(kind)
    learner = ResetRNN(rnn, reset_state_key="recurrent_state", carry=False, state_shape=shape,
                       default_recurrent_mode=True)
    torch.testing.assert_close(learner(windows.clone())["features"], expected)
    zero_start = ResetRNN(rnn, carry=False, state_shape=shape, default_recurrent_mode=True)(
        windows.clone())["features"]
    assert not torch.allclose(features(zero_start), features(expected), atol=1e-4)


@pytest.mark.parametrize("batched", ["serial", "parallel", "serial-rssm"])
def test_primer_with_a_torchrl_env(batched):
    from torchrl.envs import GymEnv, InitTracker, ParallelEnv, SerialEnv, TransformedEnv

    rnn, shape = {
        "serial": (nn.GRU(4, 8, batch_first=True), None),
        "parallel": (nn.LSTM(4, 8, num_layers=2), None),
        "serial-rssm": (
            RSSMCell(4, 8, 2, stoch_key=("latent", "stoch")),
            {"deter": (8,), ("latent", "stoch"): (2,)},
        ),
    }[batched]
    module = ResetRNN(rnn, carry=False, state_shape=shape)
    make_env = functools.partial(GymEnv, "CartPole-v1")
    base = ParallelEnv(2, make_env) if batched == "parallel" else SerialEnv(2, make_env)
    env = TransformedEnv(base, InitTracker(init_key="is_first"))
    env.append_transform(module.make_tensordict_primer())
    for key, shape in zip(module.state_keys, module.state_shapes):
        assert env.full_state_spec[key].shape == (2, *shape)
    policy = TensorDictSequential(
        TensorDictModule(nn.Linear(4, 4), in_keys=["observation"], out_keys=["embed"]),
        module,
        TensorDictModule(
            lambda f: nn.functional.one_hot((f[..., 0] > 0).long(), 2),
            in_keys=[module.out_keys[0]], out_keys=["action"],
        ),
    )
    env.set_seed(0)
    try:
        with torch.no_grad():
            rollout = env.rollout(40, policy, break_when_any_done=False)
    finally:
        env.close()
    starts = rollout["is_first"].squeeze(-1)
    assert starts[:, 0].all() and starts[:, 1:].any(), "the rollout must cross an episode end"
    carried = ~starts[:, 1:]
    for key in module.state_keys:
        state = rollout[key]
        assert state[starts].abs().sum() == 0  # zero memory at episode starts
        following = rollout[unravel_key(("next", key))]
        torch.testing.assert_close(state[:, 1:][carried], following[:, :-1][carried])
    with torch.no_grad(), set_recurrent_mode(True):
        replay = module(rollout.exclude("features").clone())["features"]
    torch.testing.assert_close(replay, rollout["features"])


def test_tensordict_state_keys_shapes_primer_and_learned_initial_state():
    module = ResetRNN(
        make_rnn("rssm_nested"), state_shape=STATE_SHAPE["rssm_nested"], initial_state="learned"
    )
    stoch = ("recurrent_state", "latent", "stoch")
    assert module.state_keys == [("recurrent_state", "deter"), stoch]
    assert module.state_shapes == [torch.Size([H]), torch.Size([2])]
    assert module.out_keys[:2] == [("features", "deter"), ("features", "latent", "stoch")]
    primer = module.make_tensordict_primer()
    assert primer.primers["recurrent_state", "deter"].shape == (H,)
    assert primer.primers[stoch].shape == (2,)
    with torch.no_grad():
        module.initial[1].copy_(torch.tensor([0.5, -2.0]))
    td = module(TensorDict({"embed": torch.randn(3, F), "is_first": torch.ones(3, 1)}, [3]))
    assert td[stoch].tolist() == [[0.5, -2.0]] * 3  # the learned value was used at the reset
    assert td["recurrent_state", "deter"].abs().sum() == 0
    torch.testing.assert_close(td["features"], td["next", "recurrent_state"])



def test_custom_cell_state_layout_comes_from_h0():
    cell = TupleCell(F, H, 2)
    cell.hidden_size = H  # a tuple-state cell may still expose hidden_size
    x, is_first = torch.randn(B, T, F), random_flags()
    h0 = (torch.randn(B, H), torch.randn(B, 2))
    y, (_, z) = rnn_with_resets(cell, x, is_first, h0)
    zeros = [torch.zeros(B, T, H), torch.zeros(B, T, 2)]
    y_ref, (_, z_ref) = reference(cell, x, is_first, h0, zeros)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(z, z_ref)


def test_module_cast_after_construction_builds_states_of_the_new_dtype():
    rnn = nn.LSTM(F, H, num_layers=2, batch_first=True)
    module = ResetRNN(rnn)
    x, is_first = torch.randn(B, T, F, dtype=torch.float64), random_flags()
    with set_recurrent_mode(True):
        module(chunk(x.float(), is_first))  # a float32 carry, then the module is cast
        carried = [c.double() for c in module._carry]
        module.double()
        y = module(chunk(x, is_first))["features"]
    zeros = [torch.zeros(B, T, 2, H, dtype=torch.float64)] * 2
    y_ref, _ = reference(rnn, x, is_first, carried, zeros)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, y_ref)
    step = module(TensorDict({"embed": x[:, 0], "is_first": torch.ones(B, 1)}, [B]))
    assert step["recurrent_state", "h"].dtype == torch.float64
    primer = module.make_tensordict_primer()
    assert primer.primers["recurrent_state", "c"].dtype == torch.float64


def test_scan_ignores_a_garbage_state_replaced_at_t0():
    """A reset at t = 0 replaces h0 whatever it holds (e.g. torch.empty), as the loop does."""
    cell = MinGRUCell(F, H)
    x, is_first = torch.randn(B, T, F), random_flags()
    is_first[:, 0] = True
    garbage = torch.full((B, H), float("nan"))
    y, h = rnn_with_resets(cell, x, is_first, garbage, backend="scan")
    y_ref, (h_ref,) = reference(cell, x, is_first, (garbage,), (torch.zeros(B, T, H),))
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(h, h_ref)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_scan_keeps_a_non_finite_input_on_its_side_of_a_reset(bad):
    """As the per-step loop: a NaN or inf observation taints its episode only (0 * inf is not 0)."""
    torch.manual_seed(0)
    cell = MinGRUCell(F, H)
    x, is_first = torch.randn(1, 6, F), torch.zeros(1, 6, dtype=torch.bool)
    x[0, 1], is_first[0, 3] = bad, True
    y, h = rnn_with_resets(cell, x, is_first, backend="scan")
    y_loop, h_loop = rnn_with_resets(cell, x, is_first, backend="loop")
    assert torch.isfinite(y[0, 3:]).all() and torch.isfinite(h).all()
    torch.testing.assert_close(y[0, 3:], y_loop[0, 3:])
    torch.testing.assert_close(h, h_loop)


def test_inputs_of_another_width_or_dtype_are_named_in_sequence_and_step_mode():
    gru = nn.GRU(F, H, batch_first=True)
    with pytest.raises(ValueError, match=f"x has {F + 2} features .* input_size is {F}"):
        rnn_with_resets(gru, torch.randn(B, T, F + 2), random_flags())
    module = ResetRNN(gru)
    with pytest.raises(ValueError, match=f"x has {F + 2} features .* input_size is {F}"):
        module.step(torch.randn(B, F + 2), None, torch.ones(B))
    with pytest.raises(TypeError, match="x is torch.float64, the GRU's parameters torch.float32"):
        module.step(torch.randn(B, F, dtype=torch.float64), None, torch.ones(B))


def test_missing_input_keys_are_named():
    module = ResetRNN(nn.GRU(F, H, batch_first=True))
    x, is_first = torch.randn(B, T, F), random_flags()
    with pytest.raises(ValueError, match="'is_first'.*is_first_key="), set_recurrent_mode(True):
        module(TensorDict({"embed": x}, [B, T]))
    with pytest.raises(ValueError, match="'embed'.*in_key="), set_recurrent_mode(True):
        module(TensorDict({"is_first": is_first}, [B, T]))
    with pytest.raises(ValueError, match="'embed'.*in_key="):
        module(TensorDict({"x": x[:, 0]}, [B]))
    learner = ResetRNN(nn.GRU(F, H, batch_first=True), reset_state_key="memory",
                       default_recurrent_mode=True)
    with pytest.raises(ValueError, match="'memory'.*reset_state_key="):
        learner(chunk(x, is_first))


def test_step_mode_refuses_a_missing_state_after_an_episode_start():
    module = ResetRNN(nn.GRUCell(F, H))
    x = torch.randn(3, F)
    first = module(TensorDict({"embed": x, "is_first": torch.ones(3, 1, dtype=torch.bool)}, [3]))
    assert first["recurrent_state"].abs().sum() == 0  # first step: no state needed
    is_first = torch.tensor([[True], [False], [True]])
    with pytest.raises(ValueError, match=r"'recurrent_state' is absent.*1 of 3 row.*make_tensordict_primer\(\)"):
        module(TensorDict({"embed": x, "is_first": is_first}, [3]))
    lstm = ResetRNN(nn.LSTMCell(F, H))
    partial = TensorDict({"embed": x, "is_first": is_first, ("recurrent_state", "h"): torch.zeros(3, H)}, [3])
    with pytest.raises(ValueError, match=r"\('recurrent_state', 'c'\) is absent"):
        lstm(partial)


def test_step_mode_reads_is_init_then_is_first_and_refuses_missing_flags():
    module = ResetRNN(nn.GRUCell(F, H))
    td = TensorDict({"embed": torch.randn(3, F)}, [3])
    with pytest.raises(ValueError, match=r"'is_init' \(or 'is_first'\), absent.*InitTracker\(\)"):
        module(td.clone())
    # TorchRL's InitTracker key, and ours where it is absent
    h = torch.randn(3, H)
    flags = torch.tensor([[True], [False], [False]])
    for key in ("is_init", "is_first"):
        out = module(td.clone().update({key: flags, "recurrent_state": h}))
        torch.testing.assert_close(out["recurrent_state"][0], torch.zeros(H))
        torch.testing.assert_close(out["recurrent_state"][1:], h[1:])
    both = td.clone().update({"is_init": flags, "is_first": ~flags, "recurrent_state": h})
    assert (module(both)["recurrent_state"][0] == 0).all()  # is_init wins


def test_sequence_mode_on_a_collector_step_names_step_mode():
    """A module built with default_recurrent_mode=True, acting in a collector: the env batch
    [N] without sequence flags is named as a step the module should run in step mode."""
    module = ResetRNN(nn.GRUCell(F, H), default_recurrent_mode=True)
    step = TensorDict({"embed": torch.randn(3, F), "is_init": torch.ones(3, 1, dtype=torch.bool),
                       "recurrent_state": torch.zeros(3, H)}, [3])
    with pytest.raises(ValueError, match=r"one sequence of 3 steps.*step mode.*default_recurrent_mode unset"):
        module(step)
    chunk = TensorDict({"embed": torch.randn(2, 3, F)}, [2, 3])  # [B, T] without flags: the key named
    with pytest.raises(ValueError, match=r"key 'is_first' not found.*is_first_key="):
        module(chunk)
    flags = torch.zeros(2, 3, 1, dtype=torch.bool)
    module(chunk.clone().update({"is_first": flags}))  # two streams carried
    flat = TensorDict({"embed": torch.randn(6, F), "is_first": torch.zeros(6, 1, dtype=torch.bool)}, [6])
    with pytest.raises(ValueError, match=r"2 rows but the input has 1 \(.*reshape a flat \[B \* T\] sample"):
        module(flat)  # a chunk flattened: one sequence of 6 steps


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch's vmap of gru_cell
def test_carry_refuses_a_transformed_state_and_carry_off_runs_under_vmap():
    import copy

    x, is_first = torch.randn(B, T, F), random_flags()
    for carry in (True, False):
        module = ResetRNN(nn.GRUCell(F, H), carry=carry, default_recurrent_mode=True)
        members = [copy.deepcopy(module) for _ in range(2)]
        for member in members:
            nn.init.normal_(member.rnn.weight_hh)
        params, buffers = torch.func.stack_module_state(members)

        def member_features(p, b):
            td = chunk(x, is_first)
            return torch.func.functional_call(module, (p, b), (td,))["features"]

        if carry:
            with pytest.raises(ValueError, match=r"carry=True\) ran under a torch.func transform"):
                torch.func.vmap(member_features)(params, buffers)
            assert module._carry is None  # nothing transformed was kept
            module(chunk(x, is_first))  # a plain call still runs
        else:
            y = torch.func.vmap(member_features)(params, buffers)
            for k, member in enumerate(members):  # the reference: each member on its own
                torch.testing.assert_close(y[k], member(chunk(x, is_first))["features"])


class _WithResets(nn.Module):
    def __init__(self, rnn, backend="auto"):
        super().__init__()
        self.rnn, self.backend = rnn, backend

    def forward(self, x, is_first):
        return rnn_with_resets(self.rnn, x, is_first, backend=self.backend)[0]


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch's vmap of the cells
@pytest.mark.parametrize("cls", [nn.GRU, nn.LSTM])
@pytest.mark.parametrize("resets", ["many", "first_only"])  # the loop's cell steps, its native segments
def test_auto_runs_under_torch_func_and_fused_names_the_fix(cls, resets):
    # auto picks fused for these sizes outside a transform; inside vmap and grad it must pick a
    # backend that runs there, each member's output and the plain gradient being the references
    x, is_first = torch.randn(B, T, F), random_flags()
    if resets == "first_only":
        is_first = torch.zeros_like(is_first)
        is_first[:, 0] = True
    members = [_WithResets(cls(F, H, batch_first=True)) for _ in range(2)]
    params = torch.func.stack_module_state(members)[0]
    y = torch.func.vmap(lambda p: torch.func.functional_call(members[0], p, (x, is_first)))(params)
    for k, member in enumerate(members):
        torch.testing.assert_close(y[k], _WithResets(member.rnn, "fused")(x, is_first))
    own = dict(members[0].named_parameters())
    grads = torch.func.grad(lambda p: torch.func.functional_call(members[0], p, (x, is_first)).square().sum())(own)
    _WithResets(members[0].rnn, "fused")(x, is_first).square().sum().backward()
    for name, value in own.items():
        torch.testing.assert_close(grads[name], value.grad)
    for backend in ("fused", "packed"):
        named = _WithResets(members[0].rnn, backend)
        with pytest.raises(RuntimeError, match=f"backend='{backend}' cannot run under a torch.func.*backend='loop'"):
            torch.func.vmap(lambda p: torch.func.functional_call(named, p, (x, is_first)))(params)
    # per-sample: vmap over rows, the reset flags batched too; each row on its own is the reference
    rnn = members[0].rnn
    rows = torch.func.vmap(lambda x_b, f_b: rnn_with_resets(rnn, x_b[None], f_b[None])[0][0])(x, is_first)
    torch.testing.assert_close(rows, rnn_with_resets(rnn, x, is_first, backend="fused")[0])
    # a backward vectorized by vmap cannot run the fused layers' backward: named, not torch's own error
    x.requires_grad_(True)
    y = rnn_with_resets(rnn, x, is_first, backend="fused")[0]
    with pytest.raises(RuntimeError, match="cannot run under vmap.*backend='loop'"):
        torch.autograd.grad(y, x, torch.randn(2, *y.shape), is_grads_batched=True)


def test_the_scan_runs_an_ensemble_under_vmap():
    # its check for non-finite inputs branches on data: under a transform (or a compile) it takes
    # the containing rounds instead, each member's plain scan being the reference
    torch.manual_seed(0)
    x, is_first = torch.randn(B, T, F), random_flags()
    members = [_WithResets(MinGRUCell(F, H), "scan") for _ in range(2)]
    params = torch.func.stack_module_state(members)[0]
    y = torch.func.vmap(lambda p: torch.func.functional_call(members[0], p, (x, is_first)))(params)
    for k, member in enumerate(members):
        torch.testing.assert_close(y[k], member(x, is_first))
    ensemble = ResetRNN(MinGRUCell(F, H), carry=False, default_recurrent_mode=True)
    ensemble_params = torch.func.stack_module_state([ensemble, ensemble])[0]
    torch.func.vmap(lambda p: torch.func.functional_call(ensemble, p, (chunk(x, is_first),))["features"])(
        ensemble_params)


@pytest.mark.parametrize("backend", ["loop", "packed", "scan"])
def test_empty_time_is_refused_and_empty_batch_runs(backend):
    rnn = MinGRUCell(F, H) if backend == "scan" else nn.LSTM(F, H, num_layers=2, batch_first=True)
    with pytest.raises(ValueError, match=r"no time step \(shape \[2, 0, 3\], T = 0\)"):
        rnn_with_resets(rnn, torch.randn(2, 0, F), torch.zeros(2, 0), backend=backend)
    y, h = rnn_with_resets(rnn, torch.randn(0, T, F), torch.zeros(0, T), backend=backend)
    assert y.shape == (0, T, H)
    assert [tuple(s.shape) for s in (h if isinstance(h, tuple) else (h,))] == (
        [(0, H)] if backend == "scan" else [(0, 2, H)] * 2
    )


def test_step_mode_names_an_empty_batch():
    module = ResetRNN(nn.GRU(3, 4, batch_first=True), in_key="x")
    with pytest.raises(ValueError, match=r"empty batch \[0\]"):
        module(TensorDict({"x": torch.randn(0, 3), "is_first": torch.zeros(0, 1, dtype=torch.bool)}, [0]))


def test_step_mode_refuses_a_state_of_another_shape():
    """A 1-layer state [3, 1, H] for a 2-layer GRU would broadcast into both layers."""
    module = ResetRNN(nn.GRU(F, H, num_layers=2, batch_first=True), default_recurrent_mode=False)
    flags = torch.zeros(3, 1, dtype=torch.bool)
    for state, got in [(torch.randn(3, 1, H), r"\[3, 1, 4\]"), (torch.randn(3, H), r"\[3, 4\]")]:
        td = TensorDict({"embed": torch.randn(3, F), "is_first": flags, "recurrent_state": state}, [3])
        with pytest.raises(ValueError, match=rf"'recurrent_state' must have shape .*\[3, 2, 4\], got {got}"):
            module(td)
    # [2, H] with 2 envs and 2 layers broadcasts to [2, 2, H] (the two envs' states as layers)
    td = TensorDict({"embed": torch.randn(2, F), "is_first": flags[:2], "recurrent_state": torch.randn(2, H)}, [2])
    with pytest.raises(ValueError, match=r"got \[2, 4\]"):
        module(td)


def test_step_mode_refuses_a_state_of_another_dtype():
    """A float64 state (written by a primer of a module since cast) for a float32 GRU."""
    module = ResetRNN(nn.GRU(F, H, batch_first=True), default_recurrent_mode=False)
    state = torch.zeros(3, 1, H, dtype=torch.float64)
    for flags in (torch.zeros(3, 1, dtype=torch.bool), torch.ones(3, 1, dtype=torch.bool)):
        td = TensorDict({"embed": torch.randn(3, F), "is_first": flags, "recurrent_state": state}, [3])
        with pytest.raises(TypeError, match=r"state entry 'recurrent_state' has dtype torch.float64, "
                                            r"the rnn's parameters torch.float32.*make_tensordict_primer"):
            module(td)
    lstm = ResetRNN(nn.LSTMCell(F, H), default_recurrent_mode=False)
    td = TensorDict({"embed": torch.randn(3, F), "is_first": torch.zeros(3, 1, dtype=torch.bool),
                     ("recurrent_state", "h"): torch.zeros(3, H),
                     ("recurrent_state", "c"): torch.zeros(3, H, dtype=torch.float16)}, [3])
    with pytest.raises(TypeError, match=r"\('recurrent_state', 'c'\) has dtype torch.float16"):
        lstm(td)


@pytest.mark.parametrize("rows", [4, 64])  # auto picks fused at 4 rows of H=128, loop at 64
@pytest.mark.parametrize("backend", ["auto", "loop", "fused"])
def test_inputs_of_another_dtype_are_refused_whatever_the_backend(rows, backend):
    """A float64 input, initial state or stored memory for a float32 GRU: fused would cast it, the
    native kernels fail deep inside; every backend refuses it alike, outside autocast."""
    gru = nn.GRU(3, 128, batch_first=True)
    x, flags = torch.randn(rows, 5, 3), torch.zeros(rows, 5, dtype=torch.bool)
    state, wide = torch.zeros(rows, 1, 128), torch.zeros(rows, 1, 128, dtype=torch.float64)
    for name, args in (("x", (x.double(), flags)), ("h0", (x, flags, wide)), ("reset_state", (x, flags, state, wide.unsqueeze(1)))):
        with pytest.raises(TypeError, match=rf"^{name} is torch.float64, the GRU's parameters torch.float32"):
            rnn_with_resets(gru, *args, backend=backend)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts its own dtype and float32, not float64
        assert rnn_with_resets(gru, x.bfloat16(), flags, backend=backend)[0].shape == (rows, 5, 128)
        assert rnn_with_resets(copy.deepcopy(gru).bfloat16(), x, flags, backend=backend)[0].shape == (rows, 5, 128)
        with pytest.raises(TypeError, match=r"^x is torch.float64"):
            rnn_with_resets(gru, x.double(), flags, backend=backend)
    module = ResetRNN(gru, in_key="observation", default_recurrent_mode=True)
    with pytest.raises(TypeError, match="x is torch.float64.*ResetRNN: x is its in_key input"):
        module(TensorDict({"observation": x.double(), "is_first": flags.unsqueeze(-1)}, [rows, 5]))


def test_sequence_mode_runs_no_rows_and_names_no_steps():
    module = ResetRNN(nn.GRU(F, H, batch_first=True), default_recurrent_mode=True)
    empty = TensorDict({"embed": torch.randn(0, T, F), "is_first": torch.zeros(0, T, 1, dtype=torch.bool)}, [0, T])
    assert module(empty)["features"].shape == (0, T, H)  # as rnn_with_resets on no rows
    for shape in ([2, 0], [0]):
        td = TensorDict({"embed": torch.randn(*shape, F), "is_first": torch.zeros(*shape, dtype=torch.bool)}, shape)
        with pytest.raises(ValueError, match=r"no time step .*T = 0"):
            module(td)


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
def test_fused_matches_loop_without_bias_and_with_dropout(cell):
    """Layers without biases and dropout between them: the same values and gradients as the loop
    backend, whose dropout draws the same masks from the same seed."""
    rnn = cell(F, H, num_layers=3, bias=False, dropout=0.5, batch_first=True)
    x, is_first = torch.randn(B, T, F, requires_grad=True), random_flags()
    results = []
    for backend in ("loop", "fused"):
        torch.manual_seed(7)
        y, h_last = rnn_with_resets(rnn, x, is_first, backend=backend)
        h_last = h_last if isinstance(h_last, tuple) else (h_last,)
        results.append((y, h_last, grads(loss_of(y, h_last), [x, *rnn.parameters()])))
    (y_loop, h_loop, g_loop), (y, h, g) = results
    torch.testing.assert_close(y, y_loop, atol=1e-5, rtol=0)
    for a, b in zip([*h, *g], [*h_loop, *g_loop]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("frozen", [None, "bias_ih_l0", "bias_hh_l0"])
def test_fused_lstm_bias_gradients_are_separate_tensors(frozen):
    """The LSTM's two biases get the same gradient, summed once: each its own tensor (a gradient
    clip scaling one in place must not scale the other), and right when either bias is frozen."""
    rnn = nn.LSTM(F, H, batch_first=True)
    if frozen:
        getattr(rnn, frozen).requires_grad_(False)
    x, is_first = torch.randn(B, T, F), random_flags()
    expected = {}
    for backend in ("loop", "fused"):
        rnn.zero_grad()
        y, h_last = rnn_with_resets(rnn, x, is_first, backend=backend)
        loss_of(y, h_last).backward()
        expected[backend] = {name: p.grad.clone() for name, p in rnn.named_parameters() if p.grad is not None}
    assert expected["fused"].keys() == expected["loop"].keys()
    for name, grad in expected["fused"].items():
        torch.testing.assert_close(grad, expected["loop"][name], atol=1e-5, rtol=0)
    if frozen is None:
        rnn.bias_ih_l0.grad.mul_(0.5)
        torch.testing.assert_close(rnn.bias_hh_l0.grad, expected["fused"]["bias_hh_l0"], atol=0, rtol=0)
        y, h_last = rnn_with_resets(rnn, x, is_first, backend="fused")
        d_ih, d_hh = torch.autograd.grad(loss_of(y, h_last), [rnn.bias_ih_l0, rnn.bias_hh_l0])
        assert d_ih is not d_hh and d_ih.data_ptr() != d_hh.data_ptr()  # scaling one in place leaves the other


def test_fused_lstm_resets_clear_non_finite_states():
    """A reset to zeros replaces a NaN or inf state (as the loop backend does), also inside
    the chunk."""
    rnn = nn.LSTM(F, H, batch_first=True)
    x = torch.randn(3, T, F)
    x[1, 1] = float("nan")  # row 1 is poisoned from step 1 until its reset at step 3
    is_first = torch.zeros(3, T, dtype=torch.bool)
    is_first[1, 3] = is_first[2, 0] = True
    h0 = (torch.zeros(3, 1, H), torch.zeros(3, 1, H))
    h0[0][2] = h0[1][2] = float("inf")  # row 2 starts from inf, reset at t = 0
    y, _ = rnn_with_resets(rnn, x, is_first, h0, backend="fused")
    y_ref, _ = rnn_with_resets(rnn, x, is_first, h0, backend="loop")
    assert y[1, 1:3].isnan().all() and y[1, 3:].isfinite().all() and y[2].isfinite().all()
    torch.testing.assert_close(y[1, 3:], y_ref[1, 3:])


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
@pytest.mark.parametrize("stored", [False, True])
def test_fused_double_backward_matches_the_loop_backend(cell, stored):
    """A gradient penalty through the fused layers (create_graph=True): the gradients and the
    penalty's gradients of the loop backend (native cells, differentiated twice by autograd),
    in float64, with resets inside the chunk and two layers, to zeros or to a stored memory."""
    rnn = cell(F, H, num_layers=2, batch_first=True).double()
    x, is_first = torch.randn(B, T, F, dtype=torch.float64, requires_grad=True), random_flags()
    entries = 2 if cell is nn.LSTM else 1
    memory = tuple(torch.randn(B, T, 2, H, dtype=torch.float64, requires_grad=True) for _ in range(entries))
    reset_state = (memory if cell is nn.LSTM else memory[0]) if stored else None
    inputs = [x, *rnn.parameters(), *(memory if stored else ())]
    results = []
    for backend in ("loop", "fused"):
        y, h_last = rnn_with_resets(rnn, x, is_first, reset_state=reset_state, backend=backend)
        h_last = h_last if isinstance(h_last, tuple) else (h_last,)
        first = torch.autograd.grad(loss_of(y, h_last), inputs, create_graph=True)
        penalty = sum((g * g).sum() for g in first)
        results.append((*first, *torch.autograd.grad(penalty, inputs)))
    assert any(g.abs().sum() > 0 for g in results[0][len(inputs):])  # the penalty does depend on them
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
@pytest.mark.parametrize("changed", ["h0", "reset_state"])
def test_fused_backward_survives_an_input_state_changed_in_place(cell, changed):
    """The initial state or the stored memory changed in place after the forward (a buffer
    refreshed, say): the first-order gradients are those of an unchanged run, as the fused
    layers saved before they supported a double backward; a double backward, which replays the
    layer from those inputs, is refused by name instead of differentiating the changed values."""
    rnn = cell(F, H, batch_first=True).double()
    x, is_first = torch.randn(B, T, F, dtype=torch.float64, requires_grad=True), random_flags()
    entries = 2 if cell is nn.LSTM else 1
    given = {"h0": [torch.randn(B, 1, H, dtype=torch.float64) for _ in range(entries)],
             "reset_state": [torch.randn(B, T, 1, H, dtype=torch.float64) for _ in range(entries)]}
    inputs = [x, *rnn.parameters()]

    def run(change: bool, create_graph: bool = False):
        states = {k: [v.clone() for v in vs] for k, vs in given.items()}
        y, h_last = rnn_with_resets(rnn, x, is_first, **{k: tuple(v) if cell is nn.LSTM else v[0]
                                                           for k, v in states.items()}, backend="fused")
        if change:
            for v in states[changed]:
                v.add_(1.0)
        h_last = h_last if isinstance(h_last, tuple) else (h_last,)
        return torch.autograd.grad(loss_of(y, h_last), inputs, create_graph=create_graph)

    for a, b in zip(run(False), run(True)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="modified in place after the forward; a double backward"):
        run(True, create_graph=True)


@pytest.mark.parametrize("backend", ["auto", "fused"])
def test_fused_lstm_runs_an_empty_batch(backend):
    rnn = nn.LSTM(F, H, batch_first=True)
    y, (h, c) = rnn_with_resets(rnn, torch.randn(0, 3, F, requires_grad=True),
                                torch.zeros(0, 3, dtype=torch.bool), backend=backend)
    assert y.shape == (0, 3, H) and h.shape == c.shape == (0, 1, H)
    (y.sum() + h.sum() + c.sum()).backward()
    assert not rnn.weight_hh_l0.grad.any()


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
def test_fused_runs_under_cpu_autocast_in_the_weights_dtype(cell):
    """Under CPU autocast (bfloat16) the fused layers run in the weights' dtype, float32: the
    values and gradients of the loop backend without autocast; a bfloat16 input is cast."""
    rnn = cell(F, H, num_layers=2, batch_first=True)
    x, is_first = torch.randn(B, T, F, requires_grad=True), random_flags()
    results = []
    for backend, autocast in (("loop", False), ("fused", True)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y, h_last = rnn_with_resets(rnn, x, is_first, backend=backend)
        h_last = h_last if isinstance(h_last, tuple) else (h_last,)
        assert y.dtype == torch.float32
        results.append((y, h_last, grads(loss_of(y, h_last), [x, *rnn.parameters()])))
    (y_loop, h_loop, g_loop), (y, h, g) = results
    for a, b in zip([y, *h, *g], [y_loop, *h_loop, *g_loop]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a bfloat16 input (an autocast layer's output)
        y_bf16, _ = rnn_with_resets(rnn, x.detach().bfloat16(), is_first, backend="fused")
    torch.testing.assert_close(y_bf16, rnn_with_resets(rnn, x.detach().bfloat16().float(), is_first)[0])


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
@pytest.mark.parametrize("batch, time", [(1, 5), (3, 1)])
def test_fused_outputs_take_in_place_ops_with_one_row_or_one_step(cell, batch, time):
    """The outputs are tensors of their own, not views of the layer's buffers (with one row or
    one step a transpose is already contiguous): in-place ops on them work, as on loop's."""
    rnn = cell(F, H, batch_first=True)
    x = torch.randn(batch, time, F, requires_grad=True)
    results = []
    for backend in ("loop", "fused"):
        y, h_last = rnn_with_resets(rnn, x, torch.zeros(batch, time, dtype=torch.bool), backend=backend)
        h_last = h_last if isinstance(h_last, tuple) else (h_last,)
        out = torch.relu_(y).sum() + sum(h.mul_(2.0).sum() for h in h_last)
        results.append((y, grads(out, [x, *rnn.parameters()])))
    (y_loop, g_loop), (y, g) = results
    for a, b in zip([y, *g], [y_loop, *g_loop]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_a_per_row_reset_state_must_say_it_is_per_row_when_rows_equal_steps():
    torch.manual_seed(0)
    gru, rows = nn.GRU(2, 3, batch_first=True), 4
    x, is_first = torch.randn(rows, rows, 2), torch.zeros(rows, rows, dtype=torch.bool)
    is_first[:, 2] = True
    per_row = torch.randn(rows, 1, 3)  # [B, *S]: as h0, which would broadcast along T where B == T
    with pytest.raises(ValueError, match=r"reset_state entries must be \[\*S\].*state.unsqueeze\(1\)"):
        rnn_with_resets(gru, x, is_first, None, per_row)
    y, _ = rnn_with_resets(gru, x, is_first, None, per_row.unsqueeze(1))  # [B, 1, *S]: per row
    for b in range(rows):  # the reference: the row's own state at the reset, by hand
        after, _ = gru(x[b:b + 1, 2:], per_row[b:b + 1].transpose(0, 1).contiguous())
        torch.testing.assert_close(y[b, 2:], after[0])
