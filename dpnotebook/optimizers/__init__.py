"""``opacus.optimizers`` under dpnotebook: the DP optimizers by their Opacus names.

Each name is dpnotebook's own class: ``DPOptimizer`` (dpnotebook's, with Opacus'
overridable ``add_noise``, see :mod:`dpnotebook.optimizers.optimizer`) clips flat, or
per layer with ``clipping="per_layer"``; ``DPOptimizerFastGradientClipping`` is the
ghost-mode optimizer. :func:`get_optimizer_class` picks one as Opacus' does.

>>> get_optimizer_class(clipping="flat", distributed=False, grad_sample_mode="ghost").__name__
'GhostDPOptimizer'
>>> get_optimizer_class(clipping="per_layer", distributed=False) is DPPerLayerOptimizer is DPOptimizer
True
"""

from __future__ import annotations

from dpnotebook.errors import UnsupportedOptionError
from dpnotebook.optimizers.optimizer import DPOptimizer
from dpnotebook.privacy import GhostDPOptimizer
from dpnotebook.privacy.distributed import DistributedDPOptimizer

__all__ = [
    "DPOptimizer",
    "DPPerLayerOptimizer",
    "DPOptimizerFastGradientClipping",
    "AdaClipDPOptimizer",
    "get_optimizer_class",
    "DistributedDPOptimizer",
]

#: Opacus' per-layer optimizer: dpnotebook's ``DPOptimizer`` with ``clipping="per_layer"``.
DPPerLayerOptimizer = DPOptimizer
#: Opacus' ghost-clipping optimizer: dpnotebook's :class:`~dpnotebook.privacy.GhostDPOptimizer`.
DPOptimizerFastGradientClipping = GhostDPOptimizer


class AdaClipDPOptimizer:
    """Opacus' adaptive clipping: refused (its noisy count spends privacy the accountant does not record)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise UnsupportedOptionError(
            "AdaClipDPOptimizer (clipping='adaptive') is not supported: its noisy count of unclipped samples "
            "spends privacy that dpnotebook's accountant does not record. Fix: DPOptimizer with a fixed "
            "max_grad_norm, or a grad-clip scheduler (dpnotebook.schedulers)."
        )


def get_optimizer_class(clipping: str, distributed: bool, grad_sample_mode: str | None = None) -> type:
    """The optimizer class for these options, as Opacus' ``get_optimizer_class`` picks it.

    ``distributed=True`` gives the all-reducing version (:mod:`dpnotebook.privacy.distributed`).
    """
    if distributed:
        from dpnotebook.privacy.distributed import distributed_optimizer_class

        return distributed_optimizer_class(get_optimizer_class(clipping, False, grad_sample_mode))
    if clipping == "adaptive":
        return AdaClipDPOptimizer
    if clipping not in ("flat", "per_layer"):
        raise ValueError(f"clipping={clipping!r} is unknown; choose one of ['adaptive', 'flat', 'per_layer'].")
    if grad_sample_mode == "ghost":
        if clipping != "flat":
            raise ValueError(
                f"clipping={clipping!r} with grad_sample_mode='ghost': Opacus' ghost optimizer clips flat."
            )
        return GhostDPOptimizer
    return DPOptimizer
