"""A 2-D toy problem: logistic regression in the plane, seeded, so each per-sample gradient is an arrow.

>>> toy = make_toy(n=8, seed=0)
>>> toy.x.shape, toy.y.shape
(torch.Size([8, 2]), torch.Size([8]))
>>> toy.grad_samples()["weight"].shape          # one 2-D gradient per sample ([B, 1, 2])
torch.Size([8, 1, 2])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dpnotebook.widgets._validate import int_at_least, non_negative, positive
from dpnotebook.widgets.grads import LossFn, compute_grad_samples

__all__ = ["ToyProblem", "make_blobs", "make_toy", "bce_loss", "ToyMLP"]


def bce_loss(output: Tensor, target: Tensor) -> Tensor:
    """Binary cross-entropy on logits ``[N, 1]`` (or ``[N]``) against 0/1 targets ``[N]``, averaged."""
    return nn.functional.binary_cross_entropy_with_logits(output.reshape(-1), target.to(output.dtype))


def make_blobs(
    n: int = 64, *, seed: int = 0, separation: float = 2.0, spread: float = 1.0, outliers: int = 3
) -> tuple[Tensor, Tensor]:
    """Two Gaussian blobs in the plane, labels 0 and 1, plus a few far, mislabelled points.

    Args:
        n: number of points (>= 2), half in each class.
        seed: the random seed; the same seed gives the same points.
        separation: distance of each blob's centre from the origin.
        spread: standard deviation of each blob.
        outliers: how many points are pushed far out with the wrong label (large gradients).

    Returns:
        ``(x, y)``: ``x`` float32 ``[n, 2]``, ``y`` float32 ``[n]`` of 0s and 1s.

    >>> x, y = make_blobs(6, seed=1, outliers=0)
    >>> y.tolist()
    [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    """
    n = int_at_least("n", n, 2)
    outliers = int_at_least("outliers", outliers, 0, n)
    positive("spread", spread)
    non_negative("separation", separation)
    gen = torch.Generator().manual_seed(seed)
    y = (torch.arange(n) % 2).float()
    centre = torch.tensor([1.0, 0.5]) * separation / (1.25**0.5)
    x = (2 * y[:, None] - 1) * centre + spread * torch.randn(n, 2, generator=gen)
    if outliers:
        idx = torch.randperm(n, generator=gen)[:outliers]
        x[idx] = -(2 * y[idx, None] - 1) * centre * 3.0 + 0.5 * torch.randn(outliers, 2, generator=gen)
    return x, y


class ToyMLP(nn.Sequential):
    """A small ``2 -> hidden -> 1`` tanh network for the toy data (seeded initialisation)."""

    def __init__(self, hidden: int = 16, *, seed: int = 0) -> None:
        hidden = int_at_least("hidden", hidden, 1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            super().__init__(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 1))


@dataclass
class ToyProblem:
    """Inputs ``x [n, 2]``, 0/1 labels ``y [n]``, a model and an averaged ``loss_fn(model(x), y)``."""

    x: Tensor
    y: Tensor
    model: nn.Module
    loss_fn: LossFn = field(default=bce_loss)

    def grad_samples(self, *, mode: str = "hooks") -> dict[str, Tensor]:
        """Each sample's gradient, by parameter name, computed in grad-sample ``mode``."""
        return compute_grad_samples(self.model, self.x, self.y, self.loss_fn, mode=mode)


def make_toy(
    n: int = 64,
    *,
    seed: int = 0,
    weight: Sequence[float] = (0.3, -0.8),
    outliers: int = 3,
    model: nn.Module | None = None,
) -> ToyProblem:
    """The 2-D logistic-regression toy: :func:`make_blobs` and a bias-free linear model.

    Args:
        n: number of points.
        seed: the random seed of the data.
        weight: the model's weight (where gradients are taken); poor on purpose, so gradients vary.
        outliers: far, mislabelled points (see :func:`make_blobs`).
        model: use this model instead of logistic regression (e.g. :class:`ToyMLP`).
    """
    x, y = make_blobs(n, seed=seed, outliers=outliers)
    if model is None:
        model = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(torch.tensor([list(weight)], dtype=torch.float32))
    return ToyProblem(x=x, y=y, model=model)


def grad_samples_of(
    model: nn.Module | None,
    batch: tuple[Tensor, Tensor] | None,
    loss_fn: LossFn | None,
    grad_samples: Mapping[str, Tensor] | list[Tensor] | None,
    toy: ToyProblem | None,
    n: int = 64,
) -> Mapping[str, Tensor] | list[Tensor]:
    """The explorers' per-sample gradients: ``grad_samples``, else ``model``'s on ``batch``, else the toy's."""
    if grad_samples is not None:
        return grad_samples
    if model is not None:
        if batch is None or loss_fn is None:
            raise ValueError("model given without batch=(inputs, targets) and loss_fn: pass all three.")
        return compute_grad_samples(model, batch[0], batch[1], loss_fn)
    return (toy if toy is not None else make_toy(n)).grad_samples()
