"""Opacus 1.6 steps for ``--compare-opacus`` (the optional extra ``opacus==1.6.0``).

Opacus is imported here only, and only when asked for, so that dpnotebook
never depends on it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

Step = Callable[[], None]


def opacus_available() -> str | None:
    """Opacus' version, or ``None`` when it is not installed."""
    try:
        import opacus
    except ImportError:
        return None
    return opacus.__version__


def opacus_step(model: nn.Module, kind: str, mode: str, x: Tensor, y: Tensor, batch: int) -> Step:
    """One Opacus step: ``kind`` ``"gsm"`` (per-sample gradients) or ``"dpsgd"`` (make_private), in ``mode``.

    Raises:
        ImportError: Opacus is not installed (``pip install opacus==1.6.0``).
    """
    if opacus_available() is None:
        raise ImportError(
            "--compare-opacus needs Opacus: pip install -c constraints.txt -e '.[opacus]' (torch stays 2.13.0)."
        )
    from opacus import PrivacyEngine
    from opacus.grad_sample.utils import wrap_model

    from dpnotebook.benchmarks.settings import CLIP, LR, SIGMA

    warnings.filterwarnings("ignore", module="opacus")
    if kind == "gsm":
        wrapped = wrap_model(model, grad_sample_mode=mode, batch_first=True, loss_reduction="mean")

        def gsm_step() -> None:
            wrapped.zero_grad(set_to_none=True)
            F.cross_entropy(wrapped(x), y).backward()

        return gsm_step
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    extra = {"criterion": nn.CrossEntropyLoss()} if mode == "ghost" else {}
    made = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        data_loader=loader,
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        poisson_sampling=False,
        grad_sample_mode=mode,
        **extra,
    )
    wrapped, opt = made[0], made[1]
    criterion = made[2] if mode == "ghost" else nn.CrossEntropyLoss()

    def dpsgd_step() -> None:
        opt.zero_grad(set_to_none=True)
        criterion(wrapped(x), y).backward()
        opt.step()

    return dpsgd_step


__all__ = ["opacus_step", "opacus_available"]
