"""Per-layer clipping bounds: one ``C`` split evenly, or Opacus' list of one bound per parameter.

``max_grad_norm`` is a number ``C`` or, with ``clipping="per_layer"``, a list
``[c_1, ..., c_L]`` (Opacus' spelling): parameter tensor ``l`` is clipped to ``c_l``
and the total bound, the sensitivity the noise is calibrated to, is
``sqrt(sum c_l^2)`` (a number ``C`` means ``c_l = C / sqrt(L)``).

>>> check_layer_bounds([3.0, 4.0], "per_layer"), total_bound([3.0, 4.0])
([3.0, 4.0], 5.0)
>>> layer_bound_list(1.0, 4)
[0.5, 0.5, 0.5, 0.5]
>>> check_layer_bounds([1.0, 2.0], "flat")
Traceback (most recent call last):
...
ValueError: max_grad_norm=[1.0, 2.0] is a list of per-layer bounds but clipping='flat'. Fix: pass clipping='per_layer' with the list, or one number for flat clipping.
"""

from __future__ import annotations

import math
from typing import Any

from dpnotebook.privacy._arguments import check_max_grad_norm

__all__ = ["check_layer_bounds", "total_bound", "layer_bound_list"]

Bounds = float | list[float]


def check_layer_bounds(value: Any, clipping: str) -> Bounds:
    """``max_grad_norm`` checked: a number > 0, or (``clipping="per_layer"`` only) a list of them."""
    if isinstance(value, (list, tuple)):
        if clipping != "per_layer":
            raise ValueError(
                f"max_grad_norm={list(value)!r} is a list of per-layer bounds but clipping={clipping!r}. "
                "Fix: pass clipping='per_layer' with the list, or one number for flat clipping."
            )
        if not value:
            raise ValueError("max_grad_norm=[] is empty: pass one bound per trainable parameter tensor.")
        return [check_max_grad_norm(c) for c in value]
    return check_max_grad_norm(value)


def total_bound(bounds: Bounds | tuple[float, ...]) -> float:
    """The sensitivity: ``C`` itself, or ``sqrt(sum c_l^2)`` for a list."""
    if isinstance(bounds, (list, tuple)):
        return math.sqrt(sum(c * c for c in bounds))
    return float(bounds)


def layer_bound_list(bounds: Bounds | tuple[float, ...], num_layers: int) -> list[float]:
    """One bound per parameter tensor: the list itself (its length must be ``num_layers``), or ``C / sqrt(L)`` each."""
    if isinstance(bounds, (list, tuple)):
        if len(bounds) != num_layers:
            raise ValueError(
                f"max_grad_norm has {len(bounds)} per-layer bounds but there are {num_layers} trainable "
                f"parameter tensors. Fix: pass one bound per tensor, in the order of model.parameters() "
                "(trainable ones only)."
            )
        return [float(c) for c in bounds]
    return [float(bounds) / math.sqrt(num_layers)] * num_layers
