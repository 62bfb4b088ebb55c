"""TorchRL's own recurrent modules (``LSTMModule``, ``GRUModule``) run inside :class:`ResetRNN`.

``ResetRNN(lstm_module)`` keeps the module, its weights, its keys and its recurrent backend
(``pad``, ``scan``, ``triton``), and adds what TorchRL's recurrent mode lacks: the state
carried from one stream chunk to the next. TorchRL's recurrent mode starts every row from
the state stored at ``t = 0`` and restarts from the stored state at every ``is_init``; so a
sequence-mode call writes, into a private copy of the chunk, the state each row starts from
at ``t = 0`` (the carry, or the reset value where ``is_first[b, 0]``) and the reset value
(zeros, a learned state or the stored memory) at every ``is_first``, and hands ``is_first`` to
the module as ``is_init``.

Our names against TorchRL's (one place; ``docs/howto/torchrl-modules.md``):

=====================  ==========================================  ===================================
what                   torchrl_seqchunk                            TorchRL
=====================  ==========================================  ===================================
episode-start flag     ``is_first`` (chunks, windows write both)   ``is_init`` (``InitTracker``)
GRU memory             ``recurrent_state``                         ``recurrent_state``
LSTM memory            ``("recurrent_state", "h")`` / ``"c"``;     ``recurrent_state_h`` /
                       TorchRL's flat keys with                    ``recurrent_state_c``
                       ``state_key=[..._h, ..._c]``
=====================  ==========================================  ===================================
"""
from __future__ import annotations

import warnings
import weakref
from typing import NamedTuple

import torch
from tensordict import TensorDict
from torch import nn
from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode

from .state import _Layout

TORCHRL_RNNS = (LSTMModule, GRUModule)
_INIT_KEY = "is_init"  # TorchRL's modules read their reset flags there, whatever their in_keys


class Adopted(NamedTuple):
    """What ``ResetRNN`` takes from a TorchRL module: its kernel, state layout and keys."""

    kernel: nn.Module  # module.lstm / module.gru: our own backends run it
    layout: _Layout
    in_key: object
    out_key: object
    state_keys: list  # flat, one per state entry: TorchRL's in_keys between input and is_init
    next_keys: list  # where the module writes the state after each step


def adopt(module) -> Adopted:
    """The kernel, state layout and keys of a TorchRL ``LSTMModule`` / ``GRUModule``."""
    lstm = isinstance(module, LSTMModule)
    kernel = module.lstm if lstm else module.gru
    if getattr(kernel, "bidirectional", False):
        raise ValueError(
            f"a bidirectional {type(module).__name__} cannot carry a state across resets or "
            "chunks; build it with bidirectional=False."
        )
    layers, hidden = kernel.num_layers, kernel.hidden_size
    if lstm and getattr(kernel, "proj_size", 0) and type(kernel) is not nn.LSTM:
        raise ValueError(
            "TorchRL's python-based LSTM with proj_size fails inside TorchRL's own forward; build the "
            "LSTMModule with python_based=False.")
    if lstm:
        out = getattr(kernel, "proj_size", 0) or hidden
        layout = _Layout([torch.Size([layers, out]), torch.Size([layers, hidden])], "tuple", ["h", "c"])
    else:
        layout = _Layout([torch.Size([layers, hidden])], "tensor", None)
    entries = len(layout.shapes)
    return Adopted(kernel, layout, module.in_keys[0], module.out_keys[0],
                   list(module.in_keys[1:1 + entries]), list(module.out_keys[1:1 + entries]))


def adopted_backend(module, adopted: Adopted) -> str:
    """``ResetRNN(module, backend="auto")``'s pick: ours (``"auto"``) on a torch ``nn.LSTM`` /
    ``nn.GRU`` under TorchRL's default backend (the same math as its ``pad``, faster), TorchRL's
    own (``"torchrl"``) where the module chose ``scan`` / ``triton`` or holds its python layer."""
    native = type(adopted.kernel) in (nn.LSTM, nn.GRU)
    return "auto" if native and module.recurrent_backend in ("pad", "auto") else "torchrl"


def torchrl_unroll(module, adopted: Adopted, x, reset, h0, reset_state):
    """One recurrent-mode call of ``module`` over rows ``[B, T]``, starting from ``h0``.

    ``x`` ``[B, T, F]``; ``reset`` bool ``[B, T]``; ``h0`` a tuple of ``[B, *S]``;
    ``reset_state`` ``None`` (zeros) or a tuple of ``[B, T, *S]``, the state taken at every
    reset step. Returns ``((y,), h_last)``: ``y`` ``[B, T, H_out]`` and the state after
    step ``T - 1`` (a tuple of ``[B, *S]``), as :func:`~torchrl_seqchunk.rnn_with_resets`.
    """
    batch, time = reset.shape
    entries = {}
    for i, (key, shape) in enumerate(zip(adopted.state_keys, adopted.layout.shapes)):
        if reset_state is None:
            stored = x.new_zeros(batch, time, *shape, dtype=h0[i].dtype)
        else:
            stored = reset_state[i]
        first = torch.where(reset[:, 0].view(batch, *[1] * len(shape)), stored[:, 0], h0[i])
        entries[key] = torch.cat([first.unsqueeze(1), stored[:, 1:]], 1)
    rows = TensorDict({adopted.in_key: x, _INIT_KEY: reset.unsqueeze(-1), **entries}, [batch, time])
    with set_recurrent_mode(True):
        rows = module(rows)
    return (rows.get(adopted.out_key),), tuple(rows.get(key)[:, -1] for key in adopted.next_keys)


def torchrl_step(module, adopted: Adopted, x, state: tuple) -> tuple:
    """One step-mode call of ``module`` from ``state`` (already reset): ``(y, new state)``,
    ``x`` ``[N, F]``, each state entry ``[N, *S]``."""
    rows = TensorDict({adopted.in_key: x, _INIT_KEY: x.new_zeros(x.shape[0], 1, dtype=torch.bool),
                       **dict(zip(adopted.state_keys, state))}, x.shape[:1])
    with set_recurrent_mode(False):
        rows = module(rows)
    return rows.get(adopted.out_key), tuple(rows.get(key) for key in adopted.next_keys)


_warned = weakref.WeakSet()


def warn_uncarried(network, where: str) -> None:
    """Warn once per module where ``network`` holds a TorchRL ``LSTMModule`` / ``GRUModule``
    that no :class:`ResetRNN` wraps: on stream chunks it would restart every chunk from the
    state stored when acting (or zeros), and the stream's carry would be lost."""
    from .module import ResetRNN  # the adapter is imported by the module

    wrapped = {id(m.rnn) for m in network.modules() if isinstance(m, ResetRNN)}
    for module in network.modules():
        if isinstance(module, TORCHRL_RNNS) and id(module) not in wrapped and module not in _warned:
            _warned.add(module)
            warnings.warn(
                f"{where} runs a TorchRL {type(module).__name__} on stream chunks: in recurrent "
                "mode it restarts every chunk from the state stored when acting (or zeros), so "
                "the state a stream carries from one chunk to the next is lost. Wrap it: "
                "ResetRNN(module, reset_state_key=...) keeps its weights, keys and backend and "
                "carries the state (docs/howto/torchrl-modules.md). Shown once per module.",
                UserWarning, stacklevel=3,
            )
