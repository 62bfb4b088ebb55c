""":class:`DQNStreamLayout`: stream chunks trained by :class:`~torchrl_seqchunk.RecurrentDQNLoss` with its carry."""
from __future__ import annotations

from ..offpolicy.loss import RecurrentDQNLoss
from ..offpolicy.unroll import unroll_with_next
from .layouts import StreamLayout

__all__ = ["DQNStreamLayout"]


class DQNStreamLayout(StreamLayout):
    """Stream chunks ``[B, T]`` trained by a :class:`~torchrl_seqchunk.RecurrentDQNLoss` that carries
    each network's state per stream (``initial_state="carry"``), as the recurrent DQN recipe does.

    Each chunk's Q-values are those the loss's online network computes, from the state the loss
    carried to the chunk (:func:`~torchrl_seqchunk.unroll_with_next`, the loss's own unroll);
    then the loss runs on the chunk (its online and target passes), moving its carries as in
    training. The check compares the Q-values (``loss.keys["action_value"]``) with acting.

    Args:
        loss (RecurrentDQNLoss): with ``initial_state="carry"``, no ``stream_key``, no ``burn_in``.
        num_streams (int): streams ``B`` (>= 1).
        seq_len (int): chunk length ``T`` (>= 1).

    Keyword Args:
        seed (int): the sampler's seed. Default ``0``.

    Raises:
        TypeError: ``loss`` is not a ``RecurrentDQNLoss``.
        ValueError: a loss that does not carry, or keeps stream ids or a burn-in (not supported here).

    Examples:
        >>> from torch import nn
        >>> from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq
        >>> from torchrl_seqchunk import RecurrentDQNLoss, ResetRNN
        >>> rnn = ResetRNN(nn.GRU(3, 8, batch_first=True), in_key="observation", state_key="q_state",
        ...                reset_state_key="q_state")
        >>> qnet = Seq(rnn, Mod(nn.Linear(8, 2), ["features"], ["action_value"]))
        >>> DQNStreamLayout(RecurrentDQNLoss(qnet, rnn), 4, 16).describe()
        'stream chunks 4 x 16 with the carry of RecurrentDQNLoss'
    """

    def __init__(self, loss: RecurrentDQNLoss, num_streams: int, seq_len: int, *, seed: int = 0):
        if not isinstance(loss, RecurrentDQNLoss):
            raise TypeError(f"loss must be a RecurrentDQNLoss, got {type(loss).__name__}.")
        if loss.initial_state != "carry" or loss.stream_key is not None or loss.burn_in:
            raise ValueError(
                f"DQNStreamLayout checks a loss with initial_state='carry', stream_key=None and burn_in=0, got "
                f"initial_state={loss.initial_state!r}, stream_key={loss.stream_key!r}, burn_in={loss.burn_in}; "
                "check windows from the stored state with SliceLayout instead.")
        super().__init__(num_streams, seq_len, second_pass=None, is_first_key=loss.rnn[0].is_first_key, seed=seed)
        self.loss = loss

    def start(self, network) -> None:
        self.loss.reset_carry()

    def train(self, run, batch) -> None:
        loss, rnn = self.loss, self.loss.rnn[0]
        carried = loss.get_extra_state()["carries"]["online"]
        start = None if carried is None else tuple(carried)
        with loss.value_network_params.to_module(loss.value_network):
            unroll = unroll_with_next(loss.value_network, rnn, batch, start, value_key=loss.keys["action_value"],
                                      terminated_key=loss.keys["terminated"], done_key=loss.keys["done"],
                                      truncated_key=loss.keys["truncated"])
        loss(batch.clone(False))
        batch.set(loss.keys["action_value"], unroll.values)

    def save(self):
        return self.loss.get_extra_state()

    def restore(self, saved) -> None:
        self.loss.set_extra_state(saved)

    def describe(self) -> str:
        return f"stream chunks {self.num_streams} x {self.seq_len} with the carry of RecurrentDQNLoss"
