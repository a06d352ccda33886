"""Submodules that *share* parameters owned by their parent layer.

A DP layer such as :class:`~dpnotebook.layers.DPLSTM` must look exactly like
its ``torch.nn`` counterpart: parameters named ``weight_ih_l0``, ``bias_k``...
directly on the layer, and the same ``state_dict``. Hooks mode, on the other
hand, computes per-sample gradients *per submodule*: a submodule with a
registered grad sampler gets the gradients of its own parameters.

We get both by registering every parameter twice: once on the parent under its
``torch.nn`` name, and once on a small :class:`SharedParameters` submodule
under a short "slot" name. ``named_parameters()`` lists each Parameter object
once, under its first (native) name, so optimizers see no duplicates. The
submodule never saves or loads anything, so the ``state_dict`` keeps the native
layout. The parent sets ``_dpn_grad_samples_from_children = True`` so that
hooks mode looks for samplers in its children instead of replaying the parent.

>>> import torch
>>> from torch import nn
>>> parent = nn.Module()
>>> parent.weight = nn.Parameter(torch.ones(2))
>>> parent.view = SharedParameters(w=parent.weight)
>>> [n for n, _ in parent.named_parameters()], list(parent.state_dict())
(['weight'], ['weight'])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn


class SharedParameters(nn.Module):
    """A module whose parameters belong to its parent (see the module docstring).

    Args:
        **slots: ``slot name -> Parameter`` (``None`` for an absent one, e.g. no bias).
    """

    def __init__(self, **slots: nn.Parameter | None) -> None:
        super().__init__()
        self.slot_names = tuple(slots)
        self.share(**slots)

    def share(self, **slots: nn.Parameter | None) -> None:
        """Point the slots at (new) parameter objects of the parent."""
        for slot, param in slots.items():
            self._parameters[slot] = param

    def extra_repr(self) -> str:
        return f"shares={list(self.slot_names)}"

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        """Save nothing: the parent saves these parameters under their native names."""

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Load nothing: the parent loads these parameters (the same objects)."""


def reshare(parent: nn.Module, links: Sequence[tuple[SharedParameters, dict[str, str]]]) -> None:
    """Point each submodule's slots at the parent's current parameters.

    Needed after anything that *replaces* a parent parameter object
    (``load_state_dict(assign=True)``, ``parent.weight = nn.Parameter(...)``,
    ``.to()`` under ``torch.__future__.set_overwrite_module_params_on_conversion``).

    Args:
        parent: the layer that owns the parameters.
        links: ``(submodule, {slot: parent attribute name})`` pairs.
    """
    for module, names in links:
        module.share(**{slot: getattr(parent, name) for slot, name in names.items()})


__all__ = ["SharedParameters", "reshare"]
