"""The DP optimizer that :meth:`~dpnotebook.privacy.engine.PrivacyEngine.make_private` builds around the user's.

Its class comes from the model: the mode registry pairs each grad-sample mode
with a DP optimizer (``ghost`` needs one that reads norms, not per-sample
gradients), and a distributed model needs that class's all-reducing version.
A :class:`~dpnotebook.privacy.data_loader.DPDataLoader` then tells the optimizer
every batch it draws, so that each step clips the samples of exactly one batch.

>>> import torch
>>> from torch import nn
>>> from dpnotebook import wrap_model
>>> model = wrap_model(nn.Linear(2, 1), "ghost")
>>> opt = private_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), module=model, distributed=False,
...                         data_loader=None, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=8)
>>> type(opt).__name__
'GhostDPOptimizer'
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from dpnotebook.privacy._step import claim_parameters
from dpnotebook.privacy.data_loader import DPDataLoader
from dpnotebook.privacy.engine_inputs import unwrap_model
from dpnotebook.privacy.ghost_optimizer import optimizer_class as mode_optimizer
from dpnotebook.privacy.optimizer import DPOptimizer

__all__ = ["private_optimizer"]


def private_optimizer(
    optimizer: Optimizer,
    *,
    module: nn.Module,
    distributed: bool,
    data_loader: Any,
    noise_multiplier: float,
    max_grad_norm: float | list[float],
    expected_batch_size: float,
    loss_reduction: str = "mean",
    clipping: str = "flat",
    generator: torch.Generator | None = None,
    secure_mode: bool | None = None,
) -> DPOptimizer:
    """Wrap ``optimizer`` in the DP optimizer of ``module``'s grad-sample mode.

    Args:
        optimizer: the optimizer over the model's parameters.
        module: the wrapped model; its ``grad_sample_mode`` picks the class
            (:class:`~dpnotebook.privacy.optimizer.DPOptimizer` for a wrapper without one).
        distributed: the model was inside DPDDP or DDP: the class's all-reducing version
            (:func:`~dpnotebook.privacy._distributed.distributed_optimizer_class`).
        data_loader: the loader of the run; a :class:`~dpnotebook.privacy.data_loader.DPDataLoader`
            reports each batch it draws to the optimizer.
        noise_multiplier: the DP optimizer's ``noise_multiplier``.
        max_grad_norm: its clipping bound (a list: one per parameter, ``clipping="per_layer"``).
        expected_batch_size: its expected batch size.
        loss_reduction: its ``loss_reduction``.
        clipping: its ``clipping``.
        generator: its noise generator.
        secure_mode: its ``secure_mode``.

    Returns:
        The DP optimizer, of the class the mode registry pairs with ``module``'s mode.
    """
    from dpnotebook.privacy._distributed import distributed_optimizer_class

    mode = getattr(module, "grad_sample_mode", None)
    optimizer_class = DPOptimizer if mode is None else mode_optimizer(mode)
    if distributed:
        optimizer_class = distributed_optimizer_class(optimizer_class)
    dp_optimizer = optimizer_class(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        loss_reduction=loss_reduction,
        clipping=clipping,
        generator=generator,
        secure_mode=secure_mode,
    )
    dp_optimizer._dp_model = module  # its K is one of a logical step's constants
    claim_parameters(dp_optimizer, unwrap_model(module).parameters())  # the whole model: one DP optimizer per model
    if isinstance(data_loader, DPDataLoader):  # each step must clip the examples of exactly one batch
        dp_optimizer.sampled_batches.tie(data_loader, module)
    return dp_optimizer
