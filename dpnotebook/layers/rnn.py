"""``DPRNN``, ``DPLSTM``, ``DPGRU``: drop-in replacements for ``nn.RNN/LSTM/GRU``.

Same constructor arguments, parameter names, ``state_dict``, inputs and outputs
(``PackedSequence`` and initial states included) as the ``torch.nn`` layers, so
``load_state_dict`` works in both directions. Built from plain tensor
operations and one :class:`~dpnotebook.layers.gate_projection.GateProjection`
per layer and direction, whose grad sampler gives hooks mode the per-sample
gradients of all parameters at once.

>>> import torch
>>> from torch import nn
>>> lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True)
>>> dp = DPLSTM(3, 4, num_layers=2, batch_first=True)
>>> _ = dp.load_state_dict(lstm.state_dict())
>>> x = torch.randn(2, 5, 3)
>>> torch.allclose(dp(x)[0], lstm(x)[0], atol=1e-6)
True
"""

from __future__ import annotations

from typing import Any

import torch

from dpnotebook.layers.rnn_base import DPRNNBase


class DPRNN(DPRNNBase):
    """Drop-in ``nn.RNN`` (Elman RNN, ``tanh`` or ``relu``) with hooks-mode per-sample gradients.

    >>> import torch
    >>> rnn = DPRNN(3, 4, nonlinearity="relu", bidirectional=True)
    >>> out, h = rnn(torch.randn(5, 2, 3))
    >>> out.shape, h.shape
    (torch.Size([5, 2, 8]), torch.Size([2, 2, 4]))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        self.nonlinearity = nonlinearity
        mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
        super().__init__(
            mode, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype
        )


class DPLSTM(DPRNNBase):
    """Drop-in ``nn.LSTM`` with hooks-mode per-sample gradients (``proj_size`` is not supported).

    >>> import torch
    >>> lstm = DPLSTM(3, 4, batch_first=True)
    >>> out, (h, c) = lstm(torch.randn(2, 5, 3))
    >>> out.shape, h.shape, [n for n, _ in lstm.named_parameters()]
    (torch.Size([2, 5, 4]), torch.Size([1, 2, 4]), ['weight_ih_l0', 'weight_hh_l0', 'bias_ih_l0', 'bias_hh_l0'])
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if proj_size != 0:
            raise NotImplementedError(
                f"DPLSTM does not support proj_size={proj_size}; use proj_size=0 (the default), or "
                "follow the LSTM with an nn.Linear to project its outputs."
            )
        super().__init__(
            "LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype
        )


class DPGRU(DPRNNBase):
    """Drop-in ``nn.GRU`` with hooks-mode per-sample gradients.

    >>> import torch
    >>> gru = DPGRU(3, 4, num_layers=2)
    >>> out, h = gru(torch.randn(5, 2, 3), torch.zeros(2, 2, 4))
    >>> out.shape, h.shape
    (torch.Size([5, 2, 4]), torch.Size([2, 2, 4]))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            "GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype
        )


__all__ = ["DPRNN", "DPLSTM", "DPGRU"]
