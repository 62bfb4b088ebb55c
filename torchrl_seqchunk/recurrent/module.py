""":class:`ResetRNN`: recurrent state with vectorized resets as a TensorDict module.

It wraps :func:`~torchrl_seqchunk.rnn_with_resets`, keeps the state between chunks
(truncated BPTT) and acts step by step in a collector.
"""
from __future__ import annotations

import warnings

import torch
from tensordict import TensorDictBase, unravel_key
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.modules import recurrent_mode

from .backends import _BACKEND_NAMES, _expanded_reset_state, _unroll
from .carry import carry_as_tensordict, carry_from_tensordict, mark_chunk, start_key, view_start
from .state import _reset_mask, _state_layout
from .step import state_entries, step_flags, step_once, step_state
from .torchrl_modules import TORCHRL_RNNS, adopt, adopted_backend, torchrl_step, torchrl_unroll

__all__ = ["ResetRNN"]


class ResetRNN(TensorDictModuleBase):
    """A recurrent TensorDict module that resets per row and carries state across chunks.

    * **Sequence mode** (time the last batch dim: a ``[B, T]`` chunk, ``[N, W]`` windows;
      leading dims are flattened into rows): the state is reset where
      ``is_first[b, t]``, to the initial state or, with ``reset_state_key``, to the
      stored memory ``td[reset_state_key][b, t]``. With ``carry=True`` each row's final
      state is kept, detached (truncated BPTT), for ``t = 0`` of the next chunk. Writes
      ``out_key`` ``[B, T, H_out]``.
    * **Step mode** (acting, any batch, one step of each env): resets where
      ``init_key`` (TorchRL's ``is_init``; else ``is_first_key``), writes the state it
      used at the root state keys and the new one under ``("next", *state_key)``, as
      TorchRL's ``LSTMModule`` does.

    The mode is TorchRL's ``set_recurrent_mode`` context, else ``default_recurrent_mode``,
    else the batch (``batch_dims >= 2``: sequence, with a warning once, since TorchRL
    would step). A state entry lives under ``state_key`` (a tensor state, ``[*batch, *S]``
    with ``S`` in :attr:`state_shapes`) or ``(*state_key, name)`` (``"h"``, ``"c"`` for an
    LSTM; the keys of ``state_shape`` for a TensorDict state); see :attr:`state_keys`.
    :attr:`out_keys` lists what the current mode writes.

    .. note:: With ``carry=True`` only the first sequence pass over a chunk carries. It
        marks the chunk: the state it started from under :attr:`start_keys` (root and
        ``"next"``, with each step's place in the chunk under ``state_key + "_start_t"``),
        and ``("next", is_first_key) |= is_first``. A later pass over the chunk, its rows or
        its ``step_mdp`` view (a target or next-value pass, as in TorchRL's ``DQNLoss``)
        starts from that state, resets where the chunk's episodes start and leaves the carry
        alone; one over a time slice (``chunk[:, k:]``) is refused with a ValueError. The first
        pass must be over the chunk itself (a loss's online pass): run first over the ``step_mdp``
        view, the module would carry the state after the next observations, and nothing in the
        view tells it apart from a chunk. :attr:`carried_state` takes and restores the carry
        (``docs/howto/reset-rnn.md``).

    Args:
        rnn (nn.Module): ``nn.GRU`` / ``nn.LSTM`` (any ``num_layers``,
            ``batch_first`` either way), ``nn.GRUCell``, ``nn.LSTMCell``,
            :class:`MinGRUCell`, or any cell ``cell(x_t, h) -> h`` with ``h`` a
            tensor, a tuple of tensors or a TensorDict of tensors with batch
            ``[N]`` (then give ``state_shape``; see :func:`rnn_with_resets`).
            Or a TorchRL ``LSTMModule`` / ``GRUModule`` (any ``num_layers``, any
            ``recurrent_backend``): its weights, keys (``in_key``, ``out_key``, its flat
            state keys such as ``recurrent_state_h`` / ``recurrent_state_c``) and backend are
            kept; with ``backend="torchrl"`` sequence mode runs the module itself in
            recurrent mode, from the carried state, with ``is_first`` given to it as
            ``is_init``, and step mode runs it in step mode; other backends run its
            ``nn.LSTM`` / ``nn.GRU`` (``docs/howto/torchrl-modules.md``).

    Keyword Args:
        in_key (NestedKey): input features ``[*batch, F]``. Default ``"embed"`` (a TorchRL
            module's own).
        out_key (NestedKey): output features ``[*batch, H_out]``, or the new
            state's entries under ``(*out_key, name)`` for a TensorDict state.
            Default ``"features"`` (a TorchRL module's own).
        is_first_key (NestedKey): sequence-mode reset flags ``[*batch]`` or
            ``[*batch, 1]``, any dtype, non-zero resets, as the chunk and window makers
            write them (they write ``init_key`` too); where a ``[B, T]`` input holds none,
            ``init_key`` is read. Default ``"is_first"``.
        init_key (NestedKey): step-mode reset flags, as TorchRL's ``InitTracker``
            writes them (in the env; TorchRL's ``Collector`` appends one itself only with
            ``auto_register_policy_transforms=True``); where absent, step mode reads
            ``is_first_key``. Default ``"is_init"``.
        state_key (NestedKey or list of NestedKey): where the state is stored: one key (its
            entries under ``(state_key, name)``), or a list of one key per entry, such as
            TorchRL's ``["recurrent_state_h", "recurrent_state_c"]`` for an LSTM. Default
            ``"recurrent_state"`` (a TorchRL module's own keys).
        reset_state_key (NestedKey or list of NestedKey, optional): sequence mode only:
            stored memory taken at reset steps instead of the initial state
            (reset-and-continue training on windows), given as ``state_key`` is. Default
            ``None``.
        initial_state (str): ``"zeros"`` or ``"learned"`` (a parameter per state
            entry, initialised to zeros). Default ``"zeros"``.
        backend (str): see :func:`rnn_with_resets`; ``"torchrl"``: a TorchRL module's own
            ``recurrent_backend``. For a TorchRL module ``"auto"`` picks ours on its
            ``nn.LSTM`` / ``nn.GRU`` where the module's is TorchRL's default (``"pad"`` or
            ``"auto"``: the same results, faster), and ``"torchrl"`` where it chose
            ``"scan"`` / ``"triton"`` or holds TorchRL's python-based layer (our backends
            refuse that layer). Default ``"auto"``.
        carry (bool): keep each row's final state between sequence-mode calls
            (part of ``state_dict``). Default ``True``.
        state_shape (shape, tuple of shapes or dict of shapes, optional): one
            row's state for a custom cell without a ``hidden_size`` attribute,
            e.g. ``(H,)``, ``((H,), (Z,))`` for a tuple state, or
            ``{"deter": (D,), "stoch": (S,)}`` (keys: entry names, any
            NestedKey) for a TensorDict state.
        default_recurrent_mode (bool, optional): ``True`` sequence mode, ``False`` step
            mode, ``None`` chosen by the input's batch dims (see above); TorchRL's
            ``set_recurrent_mode`` context overrides it. Default ``None`` (a TorchRL module's
            own ``default_recurrent_mode``).

    Raises:
        TypeError / ValueError: at construction, an unsupported ``rnn`` or option; at
            call time, bad shapes, a carried state of another batch while some
            ``is_first[:, 0]`` is False (call :meth:`reset_carry`), ``carry=True`` under a
            ``torch.func`` transform; in step mode, no reset flags, a state entry absent
            where a row is not at an episode start (append :meth:`make_tensordict_primer`),
            or of the wrong shape (``ValueError``) or dtype (``TypeError``).

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from tensordict import TensorDict
        >>> from torchrl.modules import set_recurrent_mode
        >>> module = ResetRNN(nn.GRU(3, 8, batch_first=True))
        >>> is_first = torch.zeros(4, 10, 1, dtype=torch.bool)
        >>> chunk = TensorDict({"embed": torch.randn(4, 10, 3), "is_first": is_first}, [4, 10])
        >>> with set_recurrent_mode(True):  # sequence mode, time the last batch dim
        ...     out = module(chunk)
        >>> out["features"].shape
        torch.Size([4, 10, 8])
        >>> module.state_keys, module.state_shapes
        (['recurrent_state'], [torch.Size([1, 8])])
        >>> is_init = torch.ones(2, 3, 1, dtype=torch.bool)  # an env batch [2, 3]
        >>> with set_recurrent_mode(False):  # step mode, one step of each env
        ...     step = module(TensorDict({"embed": torch.randn(2, 3, 3), "is_init": is_init}, [2, 3]))
        ...     module.out_keys
        ['features', 'recurrent_state', ('next', 'recurrent_state')]
        >>> step["recurrent_state"].abs().sum().item(), step["next", "recurrent_state"].shape
        (0.0, torch.Size([2, 3, 1, 8]))

        A cell whose state is a TensorDict (here a toy RSSM: deterministic and latent parts):

        >>> class RSSM(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.gru, self.latent = nn.GRUCell(3 + 2, 8), nn.Linear(8, 2)
        ...     def forward(self, x_t, h):
        ...         deter = self.gru(torch.cat([x_t, h["stoch"]], -1), h["deter"])
        ...         stoch = torch.tanh(self.latent(deter))
        ...         return TensorDict(deter=deter, stoch=stoch, batch_size=h.batch_size)
        >>> rssm = ResetRNN(RSSM(), state_shape={"deter": (8,), "stoch": (2,)},
        ...                 default_recurrent_mode=True)
        >>> rssm.state_keys
        [('recurrent_state', 'deter'), ('recurrent_state', 'stoch')]
        >>> out = rssm(TensorDict({"embed": torch.randn(4, 10, 3), "is_first": is_first}, [4, 10]))
        >>> out["features", "stoch"].shape, out["features", "deter"].shape
        (torch.Size([4, 10, 2]), torch.Size([4, 10, 8]))
    """

    def __init__(
        self,
        rnn: nn.Module,
        *,
        in_key=None,
        out_key=None,
        is_first_key="is_first",
        init_key="is_init",
        state_key=None,
        reset_state_key=None,
        initial_state: str = "zeros",
        backend: str = "auto",
        carry: bool = True,
        state_shape=None,
        default_recurrent_mode: bool | None = None,
    ):
        super().__init__()
        if not isinstance(rnn, nn.Module):
            raise TypeError(f"rnn must be an nn.Module, got {type(rnn).__name__}.")
        self._adopted = adopt(rnn) if isinstance(rnn, TORCHRL_RNNS) else None
        if self._adopted is not None:  # TorchRL's module: its kernel, keys and backend
            if state_shape is not None:
                raise ValueError(
                    f"state_shape is taken from the {type(rnn).__name__} itself; drop state_shape=.")
            layout = self._adopted.layout
            in_key = self._adopted.in_key if in_key is None else in_key
            out_key = self._adopted.out_key if out_key is None else out_key
            state_key = self._adopted.state_keys if state_key is None else state_key
        else:
            layout = _state_layout(rnn, state_shape)
            in_key = "embed" if in_key is None else in_key
            out_key = "features" if out_key is None else out_key
            state_key = "recurrent_state" if state_key is None else state_key
        if layout is None:
            raise ValueError(
                f"state_shape is required for a {type(rnn).__name__} without a `hidden_size` "
                "attribute; pass e.g. state_shape=(H,), ((H,), (Z,)) for a tuple state or "
                "{'deter': (D,), 'stoch': (S,)} for a TensorDict state."
            )
        if initial_state not in ("zeros", "learned"):
            raise ValueError(f"initial_state must be 'zeros' or 'learned', got {initial_state!r}.")
        if backend not in _BACKEND_NAMES + ("torchrl",):
            raise ValueError(f"backend must be one of {_BACKEND_NAMES + ('torchrl',)}, got {backend!r}.")
        if self._adopted is None and backend == "torchrl":
            raise ValueError(
                f"backend='torchrl' runs a TorchRL LSTMModule / GRUModule, got a {type(rnn).__name__}; "
                "pass the TorchRL module as rnn, or pick one of " + str(_BACKEND_NAMES) + ".")
        if self._adopted is not None and backend == "auto":
            backend = adopted_backend(rnn, self._adopted)
        elif self._adopted is not None and backend != "torchrl" and type(self._adopted.kernel) not in (nn.LSTM, nn.GRU):
            raise ValueError(
                f"backend={backend!r} runs a torch nn.LSTM / nn.GRU; this {type(rnn).__name__} holds TorchRL's "
                "python-based layer: pass backend='torchrl' (or 'auto', which picks it).")
        if not (default_recurrent_mode is None or isinstance(default_recurrent_mode, bool)):
            raise TypeError(
                f"default_recurrent_mode must be True (sequence mode), False (step mode) or None "
                f"(chosen by the batch dims), got {default_recurrent_mode!r}."
            )
        self.rnn = rnn
        self._layout = layout
        self.state_shapes, names = layout.shapes, layout.names
        self.backend = backend
        self.carry = bool(carry)
        self.in_key, self.out_key = unravel_key(in_key), unravel_key(out_key)
        self.is_first_key = unravel_key(is_first_key)
        self.init_key = unravel_key(init_key)
        self.state_keys = self._entry_keys(state_key, names, "state_key")
        self.reset_state_keys = (
            None if reset_state_key is None else self._entry_keys(reset_state_key, names, "reset_state_key")
        )
        self.in_keys = list(dict.fromkeys(
            [self.in_key, self.is_first_key, self.init_key, *self.state_keys, *(self.reset_state_keys or [])]
        ))
        output_names = names if layout.kind == "tensordict" else None
        self._output_keys = self._entry_keys(out_key, output_names)
        self._next_keys = ([unravel_key(k) for k in self._adopted.next_keys]
                           if self._adopted is not None and state_key == self._adopted.state_keys
                           else [unravel_key(("next", k)) for k in self.state_keys])
        flat = isinstance(state_key, list)  # one key per entry (TorchRL's recurrent_state_h / _c)
        self.start_keys = ([start_key(k) for k in self.state_keys] if flat
                           else self._entry_keys(start_key(state_key), names, "state_key"))
        mark_key = self.state_keys[0] if flat else state_key
        self._start_token_key = unravel_key(start_key(mark_key, "_start_by"))
        self._start_step_key = unravel_key(start_key(mark_key, "_start_t"))  # each step's place in the chunk
        marks = [self._start_token_key, self._start_step_key, *self.start_keys]
        self.chunk_mark_keys = [  # what a carrying pass writes besides its output
            *marks, *(unravel_key(("next", k)) for k in marks),
            unravel_key(("next", self.is_first_key)),
        ]
        if default_recurrent_mode is None and self._adopted is not None:  # the TorchRL module's own
            default_recurrent_mode = rnn._recurrent_mode
        self.default_recurrent_mode = default_recurrent_mode
        self._ran_sequence = False  # mode of the latest call, for an inferred mode
        self._warned_inferred = False
        param = next(rnn.parameters(), torch.empty(0))
        self.initial = None
        if initial_state == "learned":
            self.initial = nn.ParameterList(
                nn.Parameter(param.new_zeros(s)) for s in self.state_shapes
            )
        self._carry = None

    @staticmethod
    def _entry_keys(key, names, arg: str = "out_key"):
        """The keys of each state entry: ``key`` itself (one entry), ``(key, name)`` per entry,
        or a list given one key per entry (TorchRL's flat ``recurrent_state_h`` / ``_c``)."""
        count = 1 if names is None else len(names)
        if isinstance(key, list):
            if len(key) != count:
                raise ValueError(
                    f"{arg}={key!r} lists {len(key)} key(s), the state has {count} entr"
                    f"{'y' if count == 1 else 'ies'} {names or ''}; give one key per entry, e.g. "
                    "['recurrent_state_h', 'recurrent_state_c'] for an LSTM (TorchRL's LSTMModule keys).")
            return [unravel_key(k) for k in key]
        key = unravel_key(key)
        if names is None:
            return [key]
        return [unravel_key((key, name)) for name in names]

    @property
    def recurrent_mode(self) -> bool | None:
        """``True`` sequence mode, ``False`` step mode, ``None`` chosen by the batch dims:
        TorchRL's ``set_recurrent_mode`` context if set, else ``default_recurrent_mode``."""
        mode = recurrent_mode()
        return self.default_recurrent_mode if mode is None else mode

    @property
    def out_keys(self) -> list:
        """The keys the current mode writes (see the class docstring)."""
        sequence = self.recurrent_mode
        if sequence is None:
            sequence = self._ran_sequence
        if sequence:
            return [*self._output_keys, *(self.chunk_mark_keys if self.carry else ())]
        return [*self._output_keys, *self.state_keys, *self._next_keys]

    # -- state helpers -------------------------------------------------------
    @property
    def _dtype(self) -> torch.dtype:
        """The rnn's current parameter dtype (it follows ``module.double()`` and such); its own
        first parameter where it has one (no walk over submodules: step mode reads it every step)."""
        for own in self.rnn._parameters.values():
            if own is not None:
                return own.dtype
        return next(self.rnn.parameters(), torch.empty(0)).dtype

    def _get(self, tensordict, key, option: str) -> torch.Tensor:
        try:
            value = tensordict.get(key, None)
        except (ValueError, AttributeError):  # a tensor where the key nests under it
            value = None
        if value is None:
            held = tensordict.keys(True, True) if isinstance(tensordict, TensorDictBase) else tensordict.keys()
            flat = isinstance(key, tuple) and isinstance(tensordict.get(key[0], None), torch.Tensor)
            hint = (f" ({key[0]!r} is a tensor: for a state of several entries stored under one "
                    "flat key each, as TorchRL's LSTMModule stores h and c, give a list, e.g. "
                    f"{option}=['recurrent_state_h', 'recurrent_state_c'])") if flat else ""
            raise ValueError(
                f"key {key!r} not found in the input TensorDict (its keys: "
                f"{sorted(map(str, held))}); pass {option}= naming the "
                f"entry the data holds{hint}."
            )
        return value

    def _initial_state(self, batch: int, device) -> tuple:
        if self.initial is None:
            return tuple(
                torch.zeros(batch, *s, dtype=self._dtype, device=device) for s in self.state_shapes
            )
        return tuple(p.expand(batch, *p.shape) for p in self.initial)

    def reset_carry(self, mask=None) -> None:
        """Forget the carried state: of every row (``mask=None``) or of rows where ``mask``.

        Args:
            mask (Tensor, optional): ``[B]`` (or ``[B, 1]``), any dtype, non-zero
                resets that row's carried state to the initial state.
        """
        if mask is None or self._carry is None:
            self._carry = None
            return
        batch = self._carry[0].shape[0]
        mask = _reset_mask(mask, (batch,), "mask").to(self._carry[0].device)
        initial = self._initial_state(batch, self._carry[0].device)
        self._carry = tuple(
            torch.where(mask.view(-1, *([1] * len(s))), i.detach(), c)
            for c, i, s in zip(self._carry, initial, self.state_shapes)
        )

    @property
    def carried_state(self) -> TensorDictBase | None:
        """The state carried to the next chunk: ``None`` (none yet, or after :meth:`reset_carry`)
        or a TensorDict with batch ``[B]`` (one row per stream) holding, under each of
        :attr:`state_keys`, a detached ``[B, *S]`` tensor. Assign one (or ``None``) to restore it."""
        return carry_as_tensordict(self._carry, self.state_keys)

    @carried_state.setter
    def carried_state(self, value) -> None:
        self._carry = carry_from_tensordict(value, self.state_keys, self.state_shapes)

    def get_extra_state(self):
        return {"carry": None if self._carry is None else list(self._carry)}

    def set_extra_state(self, state) -> None:
        carry = state["carry"]
        self._carry = None if carry is None else tuple(carry)

    def make_tensordict_primer(self):
        """A TorchRL ``TensorDictPrimer`` declaring the state entries in the env specs.

        Append it to a ``TransformedEnv`` (single env, ``SerialEnv`` or
        ``ParallelEnv``; shapes are expanded to the env batch) together with
        TorchRL's ``InitTracker()``, so that the state written to
        ``("next", *state_key)`` moves to the root at every step and is zeroed
        at resets; TorchRL's collector with ``auto_register_policy_transforms=True``
        appends both itself.
        """
        from torchrl.data import Unbounded
        from torchrl.envs import TensorDictPrimer

        return TensorDictPrimer(
            {
                k: Unbounded(shape=s, dtype=self._dtype)
                for k, s in zip(self.state_keys, self.state_shapes)
            },
            expand_specs=True,
        )

    # -- forward -------------------------------------------------------------
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        sequence = self.recurrent_mode
        if sequence is None:
            sequence = tensordict.batch_dims >= 2
            if sequence and not self._warned_inferred:
                self._warned_inferred = True
                warnings.warn(
                    f"ResetRNN runs a batch {list(tensordict.shape)} in sequence mode (time the "
                    "last batch dim) because it has 2 or more batch dims; TorchRL's "
                    "LSTMModule / GRUModule would run it in step mode. Say which you mean: "
                    "ResetRNN(..., default_recurrent_mode=True) for a module that only trains "
                    "on sequences, or call it under torchrl.modules.set_recurrent_mode(True) "
                    "(sequences) / set_recurrent_mode(False) (one step of each env of a "
                    "multi-dim env batch). Shown once per module.",
                    stacklevel=4,  # the caller of nn.Module.__call__
                )
        self._ran_sequence = sequence
        return self._sequence(tensordict) if sequence else self._step(tensordict)

    def _sequence(self, tensordict: TensorDictBase) -> TensorDictBase:
        shape = tensordict.shape
        if not shape:
            raise ValueError(
                "ResetRNN sequence mode needs a time dim (the last batch dim), got a TensorDict "
                "with batch []; give it a batch [T] or [B, T], or call it in step mode "
                "(torchrl.modules.set_recurrent_mode(False))."
            )
        # a [B, T] batch is read as it is; others as rows [B, T] (also for 0 rows or steps)
        rows = tensordict if len(shape) == 2 else tensordict.reshape(shape[:-1].numel(), shape[-1])
        y = self._unroll_rows(rows, shape, chunk=tensordict)
        tensordict.set(self.out_key, y.reshape(*shape, *y.shape[2:]))
        return tensordict

    def _unroll_rows(self, rows, shape, *, chunk: TensorDictBase | None = None):
        """Sequence mode on rows ``[B, T]``: what it writes at ``out_key``, ``[B, T, H_out]``.

        ``rows`` holds the inputs as ``[B, T, ...]`` entries: a TensorDict, or a ``dict`` from
        keys (as ``unravel_key`` gives them) to tensors, the plain-tensor path of a module with
        ``carry=False`` (a carrying module marks ``chunk``, the TensorDict it was called on).
        ``shape`` is the batch the rows came from (``[B, T]``, ``[T]``, or more leading dims
        flattened into ``B``). Raises as sequence mode does.
        """
        x = self._get(rows, self.in_key, "in_key")
        batch = x.shape[0]
        flag_key = self.is_first_key  # else TorchRL's is_init, where [B, T] data holds only that
        is_first = rows.get(flag_key, None)
        if is_first is None and len(shape) > 1 and rows.get(self.init_key, None) is not None:
            flag_key, is_first = self.init_key, rows.get(self.init_key)
        if len(shape) == 1 and is_first is None:
            raise ValueError(
                f"ResetRNN in sequence mode reads a batch {list(shape)} as one sequence of {shape[0]} "
                f"steps, and it holds no reset flags {self.is_first_key!r}. If a collector is acting "
                "(one step of each env), the module must run in step mode: leave "
                "default_recurrent_mode unset (TorchRL's losses enter sequence mode themselves) or act "
                "under torchrl.modules.set_recurrent_mode(False). Otherwise pass is_first_key= naming "
                "the flags the data holds."
            )
        if is_first is None:
            is_first = self._get(rows, flag_key, "is_first_key")  # raises, naming the keys held
        reset = _reset_mask(is_first, (batch, shape[-1]), "is_first")
        h0 = self._initial_state(batch, x.device)
        start = (view_start(rows, self.start_keys, self._start_token_key, self._start_step_key, id(self))
                 if self.carry else None)
        if start is not None:  # a view of a chunk already carried: same start, no carry
            h0 = tuple(s.to(x.device, self._dtype) for s in start)
        elif self.carry and self._carry is not None:
            if self._carry[0].shape[0] == batch:
                h0 = tuple(c.to(x.device, self._dtype) for c in self._carry)
            elif not bool(reset[:, :1].all()):  # T = 0 is refused by _unroll
                flat = (" (a batch of one dim is one sequence: reshape a flat [B * T] sample to [B, T])"
                        if len(shape) == 1 else "")
                raise ValueError(
                    f"the carried state holds {self._carry[0].shape[0]} rows but the input has "
                    f"{batch}{flat} and not every row starts with is_first; call reset_carry() when "
                    "the number of streams changes."
                )
        if self.reset_state_keys is not None:
            keys = self.reset_state_keys
            reset_state = tuple(self._get(rows, k, "reset_state_key") for k in keys)
        else:
            reset_state = None if self.initial is None else tuple(self.initial)
        if self.backend == "torchrl":
            reset_state = _expanded_reset_state(reset_state, self._layout, batch, shape[-1])
            y, h_last = torchrl_unroll(self.rnn, self._adopted, x, reset, h0, reset_state)
        else:
            kernel = self.rnn if self._adopted is None else self._adopted.kernel
            y, h_last = _unroll(kernel, x, reset, h0, reset_state, self._layout, self.backend)
        if self.carry and start is None:
            if any(torch._C._functorch.is_functorch_wrapped_tensor(h) for h in h_last):
                raise ValueError(
                    "ResetRNN(carry=True) ran under a torch.func transform (vmap, grad, e.g. an "
                    "ensemble through functional_call): keeping its final state would store a "
                    "transformed tensor, which fails on the next plain call. Build the module "
                    "with carry=False for transformed calls (the state then starts at "
                    "is_first, from the initial state or reset_state_key), or call it plainly."
                )
            if batch:  # a pass over no row (B = 0) leaves the streams' carry as it was
                self._carry = tuple(h.detach() for h in h_last)
            mark_chunk(chunk, self.start_keys, h0, flag_key, (self._start_token_key, self._start_step_key),
                       id(self))
        return self._layout.output(y)

    def step(self, x: torch.Tensor, state, reset: torch.Tensor) -> tuple:
        """One step of each env on plain tensors: step mode without a TensorDict.

        Args:
            x (Tensor): input features ``[N, F]`` (float, the rnn's dtype).
            state (tuple of Tensor or None): the state each row ended its previous step with,
                one ``[N, *S]`` tensor per entry of :attr:`state_keys` (``None``: absent,
                allowed only where every row resets, as at a collector's first step).
            reset (Tensor): ``[N]`` or ``[N, 1]``, any dtype, non-zero where an episode starts
                (TorchRL's ``is_init``): that row starts from the initial state.

        Returns:
            ``(y, used, new)``: the output ``[N, H_out]``, the state the step started from and
            the state after it, as tuples of ``[N, *S]`` (what step mode writes at the root state
            keys and under ``("next", *state_key)``). For a TensorDict state, ``y`` is that
            TensorDict.

        Raises:
            ValueError / TypeError: as step mode (a state absent where a row does not reset, an
                entry of the wrong shape or dtype); ValueError for a ``state`` that is not a tuple
                of one ``[N, *S]`` tensor per state entry.
        """
        reset = _reset_mask(reset, (x.shape[0],), "reset").to(x.device)
        initial = None if self.initial is None else tuple(self.initial)
        stored = state_entries(state, self.state_keys, x.shape[0])
        used = step_state(stored, reset, initial, self.state_keys, self.state_shapes, self._dtype, x.shape[:1])
        y, new = self._step_once(x, used)
        return y, used, new

    def _step_once(self, x: torch.Tensor, state: tuple) -> tuple:
        if self.backend == "torchrl" and not getattr(self._adopted.kernel, "proj_size", 0):
            return torchrl_step(self.rnn, self._adopted, x, state)  # TorchRL's own step mode
        # (TorchRL's step mode zero-fills c with h's shape, which fails under proj_size: ours steps it)
        return step_once(self.rnn if self._adopted is None else self._adopted.kernel, self._layout, x, state)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        shape = tensordict.shape
        if not shape.numel():
            raise ValueError(
                f"ResetRNN step mode got an empty batch {list(shape)}; call it on at least one "
                "env (or skip the call when no env is left)."
            )
        flat = tensordict.batch_dims == 1  # a batch of envs: no reshape there and back
        rows = tensordict if flat else tensordict.reshape(-1)
        x = self._get(rows, self.in_key, "in_key")
        reset = step_flags(rows, self.init_key, self.is_first_key)
        initial = None if self.initial is None else tuple(self.initial)
        stored = [rows.get(k, None) for k in self.state_keys]
        state = step_state(stored, reset, initial, self.state_keys, self.state_shapes, self._dtype, shape)
        y, new = self._step_once(x, state)
        unflat = (lambda v: v) if flat else (lambda v: v.reshape(*shape, *v.shape[1:]))
        for key, next_key, used, nxt in zip(self.state_keys, self._next_keys, state, new):
            tensordict.set(key, unflat(used))
            tensordict.set(next_key, unflat(nxt))
        tensordict.set(self.out_key, unflat(y))
        return tensordict
