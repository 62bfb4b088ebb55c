"""Recurrent cells that the scan backend runs in parallel over time.
"""
from __future__ import annotations

import torch
from torch import nn

from .._checks import check_int

__all__ = ["MinGRUCell"]


class MinGRUCell(nn.Module):
    """The minGRU cell, a GRU whose gates read only the input (linear in ``h``).

    ``z_t = sigmoid(W_z x_t + b_z)``, ``h~_t = W_h x_t + b_h`` and
    ``h_t = (1 - z_t) * h_{t-1} + z_t * h~_t``, from Feng et al., "Were RNNs All
    We Needed?" (2024), section 3.1. Because ``h_t = a_t * h_{t-1} + b_t`` with
    ``a_t, b_t`` computed from ``x_t`` alone, a whole sequence runs as a parallel
    prefix scan (``backend="scan"`` of :func:`rnn_with_resets`).

    Args:
        input_size (int): features of ``x_t``.
        hidden_size (int): features of ``h``.

    Keyword Args:
        bias (bool): whether the two projections have a bias. Default ``True``.

    Shapes: ``forward(x [*, input_size], h [*, hidden_size]) -> h [*, hidden_size]``,
    float tensors on one device.

    Examples:
        >>> import torch
        >>> cell = MinGRUCell(3, 5)
        >>> cell(torch.randn(4, 3), torch.zeros(4, 5)).shape
        torch.Size([4, 5])
    """

    def __init__(self, input_size: int, hidden_size: int, *, bias: bool = True):
        super().__init__()
        self.input_size = check_int("input_size", input_size, low=1)
        self.hidden_size = check_int("hidden_size", hidden_size, low=1)
        self.linear = nn.Linear(input_size, 2 * hidden_size, bias=bias)

    def linear_coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(a, b)`` with ``h_t = a * h_{t-1} + b``; both ``[*, hidden_size]``."""
        gate, candidate = self.linear(x).chunk(2, dim=-1)
        z = torch.sigmoid(gate)
        return 1 - z, z * candidate

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        a, b = self.linear_coefficients(x)
        return torch.addcmul(b, a, h)
