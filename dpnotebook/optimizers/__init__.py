"""``opacus.optimizers`` under dpnotebook (:mod:`dpnotebook._opacus.optimizers`)."""

from dpnotebook._opacus.optimizers import (
    AdaClipDPOptimizer,
    DistributedDPOptimizer,
    DPOptimizer,
    DPOptimizerFastGradientClipping,
    DPPerLayerOptimizer,
    get_optimizer_class,
)

__all__ = [
    "DPOptimizer",
    "DPPerLayerOptimizer",
    "DPOptimizerFastGradientClipping",
    "AdaClipDPOptimizer",
    "get_optimizer_class",
    "DistributedDPOptimizer",
]
