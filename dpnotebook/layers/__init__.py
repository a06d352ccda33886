"""Drop-in DP replacements for ``torch.nn`` layers that hooks mode cannot handle as they are.

Each has the same constructor, parameter names, ``state_dict`` and outputs as the ``torch.nn`` layer,
so ``load_state_dict`` works both ways; ``dpnotebook.fix(model)`` swaps them in for you.
:class:`LoRALinear` (and :func:`add_lora`) is the exception: a frozen linear layer with a trainable
low-rank adapter, for private fine-tuning. The units the layers are built of (and their grad
samplers compute for) live in :mod:`dpnotebook.units` and are re-exported here.
"""

from dpnotebook.layers.attention import DPMultiheadAttention
from dpnotebook.layers.lora import add_lora
from dpnotebook.layers.rnn import DPGRU, DPLSTM, DPRNN, DPRNNBase
from dpnotebook.units import AppendBias, GateProjection, HiddenRecord, InProjection, LoRALinear, OutProjection

__all__ = [
    "DPRNN",
    "DPLSTM",
    "DPGRU",
    "DPRNNBase",
    "DPMultiheadAttention",
    "LoRALinear",
    "add_lora",
    "InProjection",
    "AppendBias",
    "OutProjection",
    "GateProjection",
    "HiddenRecord",
]
