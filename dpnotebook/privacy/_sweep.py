"""Privacy-utility sweeps: many small DP-SGD runs at different budgets, settings and seeds, summarised.

:func:`train_run` trains a small MLP on in-memory tensors (Poisson batches indexed straight out of them,
hooks mode, sigma calibrated for exactly the steps taken) with one :class:`RunSetting`;
:func:`summarise` groups the :class:`RunResult` of many: mean and standard deviation over seeds.

>>> import torch
>>> from torch.utils.data import TensorDataset
>>> x = torch.randn(200, 4, generator=torch.Generator().manual_seed(0))
>>> data = TensorDataset(x, (x[:, 0] > 0).long())
>>> settings = [RunSetting(epsilon=None, epochs=2, batch_size=20, num_classes=2),
...             RunSetting(epsilon=4.0, epochs=2, batch_size=20, num_classes=2)]
>>> results = sweep(settings, data, data, seeds=[0, 1])
>>> [(r.setting.private, r.seed) for r in results]
[(False, 0), (False, 1), (True, 0), (True, 1)]
>>> all(r.epsilon <= 4.0 for r in results if r.setting.private), [s.n for s in summarise(results, by="epsilon")]
(True, [2, 2])
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset
from tqdm.auto import tqdm

from dpnotebook.models import MLP
from dpnotebook.modes import wrap_model
from dpnotebook.privacy._accounting import compute_epsilon, get_noise_multiplier, steps_for_epochs, steps_per_epoch
from dpnotebook.privacy._arguments import check_positive_int, check_positive_number
from dpnotebook.privacy._data import PoissonBatchSampler
from dpnotebook.privacy._optimizer import DPOptimizer, as_wrapper
from dpnotebook.privacy._training import show_progress

Tensors = TensorDataset | tuple[Tensor, Tensor]


@dataclass(frozen=True)
class RunSetting:
    """The hyper-parameters of one run.

    Attributes:
        epsilon: the target epsilon; ``None`` with ``noise_multiplier=None`` trains without privacy.
        noise_multiplier: sigma, given instead of ``epsilon``.
        batch_size: the expected batch size ``q * N``.
        epochs: passes over the data, in expectation.
        max_grad_norm: the clipping bound C.
        lr, momentum: SGD's.
        delta: the delta of the budget.
        hidden, num_classes: the MLP's hidden width and outputs.
        accountant: ``"pld"`` or ``"rdp"``.

    >>> setting = RunSetting(epsilon=2.0, batch_size=32)
    >>> setting.private, setting.with_(epsilon=None).private
    (True, False)
    """

    epsilon: float | None = None
    noise_multiplier: float | None = None
    batch_size: int = 64
    epochs: float = 10
    max_grad_norm: float = 1.0
    lr: float = 0.5
    momentum: float = 0.0
    delta: float = 1e-5
    hidden: int = 32
    num_classes: int = 10
    accountant: str = "pld"

    def __post_init__(self) -> None:
        if self.epsilon is not None and self.noise_multiplier is not None:
            raise ValueError(
                f"epsilon={self.epsilon!r} and noise_multiplier={self.noise_multiplier!r}: give one of them "
                "(sigma is calibrated for epsilon), or neither for a non-private run."
            )
        check_positive_int("batch_size", self.batch_size)
        check_positive_number("epochs", self.epochs)
        check_positive_number("lr", self.lr)

    @property
    def private(self) -> bool:
        """Whether the run clips and adds noise."""
        return self.epsilon is not None or self.noise_multiplier is not None

    def with_(self, **changes: Any) -> RunSetting:
        """A copy with some fields changed."""
        return replace(self, **changes)


def noise_on_average(noise_multiplier: float, max_grad_norm: float, batch_size: float) -> float:
    """``sigma * C / B``: the std of the noise on each coordinate of the averaged gradient.

    >>> noise_on_average(2.0, 1.0, 64)
    0.03125
    """
    return noise_multiplier * max_grad_norm / batch_size


@dataclass(frozen=True)
class RunResult:
    """What one run gave.

    Attributes:
        setting: its :class:`RunSetting`.
        seed: seeds the initialisation, the batches and the noise.
        accuracy: on the test tensors.
        epsilon: spent at ``setting.delta`` (``inf`` without privacy).
        noise_multiplier: sigma (0 without privacy).
        steps, seconds: the steps taken and the training's wall time.
        trained_parameters: ``d``, the number of parameters trained.
        clipped_sum_norm, noise_norm: the mean norms of the clipped sum and of its noise over the steps.

    >>> RunResult(RunSetting(batch_size=32), seed=0, accuracy=0.9, epsilon=2.0, noise_multiplier=1.6, steps=100,
    ...           seconds=1.0).noise_on_average
    0.05
    """

    setting: RunSetting
    seed: int
    accuracy: float
    epsilon: float
    noise_multiplier: float
    steps: int
    seconds: float
    trained_parameters: int = 0
    clipped_sum_norm: float = 0.0
    noise_norm: float = 0.0

    @property
    def noise_on_average(self) -> float:
        """:func:`noise_on_average` of this run."""
        return noise_on_average(self.noise_multiplier, self.setting.max_grad_norm, self.setting.batch_size)


def _tensors(data: Tensors) -> tuple[Tensor, Tensor]:
    x, y = data.tensors if isinstance(data, TensorDataset) else data
    return x, y


def _default_model(setting: RunSetting, in_features: int) -> nn.Module:
    return MLP(in_features=in_features, hidden=setting.hidden, num_classes=setting.num_classes)


def train_run(
    setting: RunSetting,
    train: Tensors,
    test: Tensors,
    *,
    seed: int = 0,
    model_fn: Callable[[RunSetting, int], nn.Module] | None = None,
    device: torch.device | str | None = None,
) -> RunResult:
    """Train one model with ``setting`` (privately or not) and measure its test accuracy.

    Args:
        setting: the hyper-parameters.
        train: the training tensors ``(inputs, labels)`` (or a ``TensorDataset``).
        test: the test tensors.
        seed: seeds the initialisation, the Poisson batches and the noise.
        model_fn: ``model_fn(setting, in_features)`` builds the model (default: an MLP) under the seed;
            only parameters with ``requires_grad`` are trained.
        device: where to train (default: the model's); the noise is drawn there.
    """
    x, y = _tensors(train)
    n = len(x)
    q = setting.batch_size / n
    if not 0 < q <= 1:
        raise ValueError(f"batch_size={setting.batch_size} is invalid for {n} training samples: it must be <= {n}.")
    steps = steps_for_epochs(setting.epochs, steps_per_epoch(q))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (model_fn or _default_model)(setting, math.prod(x.shape[1:]))
    if device is not None:
        model.to(device)
    where = next((p.device for p in model.parameters()), torch.device("cpu"))
    x, y = x.to(where), y.to(where)
    sigma = setting.noise_multiplier or 0.0
    if setting.epsilon is not None:
        sigma = get_noise_multiplier(
            target_epsilon=setting.epsilon,
            target_delta=setting.delta,
            sample_rate=q,
            steps=steps,
            accountant=setting.accountant,
        )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer: torch.optim.Optimizer = torch.optim.SGD(params, lr=setting.lr, momentum=setting.momentum)
    dp_optimizer: DPOptimizer | None = None
    trained = model
    if setting.private:
        trained = wrap_model(model, "hooks")
        optimizer = dp_optimizer = DPOptimizer(
            optimizer,
            noise_multiplier=sigma,
            max_grad_norm=setting.max_grad_norm,
            expected_batch_size=q * n,
            generator=torch.Generator(device=where).manual_seed(seed + 1),
        )
    batches = PoissonBatchSampler(n, sample_rate=q, steps=steps, generator=torch.Generator().manual_seed(seed + 2))
    signal = noise = 0.0
    start = time.perf_counter()
    for indices in batches:
        optimizer.zero_grad()
        if indices:
            F.cross_entropy(trained(x[indices]), y[indices]).backward()
            optimizer.step()
        elif setting.private:  # an empty batch is still a step: noise only
            optimizer.step()
        if dp_optimizer is not None:
            stats = dp_optimizer.last_step_stats
            assert stats is not None  # every batch, even an empty one, took a step
            signal += stats.clipped_sum_norm / steps
            noise += stats.noise_norm / steps
    seconds = time.perf_counter() - start
    epsilon = math.inf
    if setting.private:
        as_wrapper(trained).to_standard_module()
        if sigma > 0:
            epsilon = compute_epsilon(
                noise_multiplier=sigma, sample_rate=q, steps=steps, delta=setting.delta, accountant=setting.accountant
            )
    x_test, y_test = _tensors(test)
    with torch.no_grad():
        accuracy = float((model(x_test.to(where)).argmax(dim=1) == y_test.to(where)).float().mean())
    d = sum(p.numel() for p in params)
    return RunResult(setting, seed, accuracy, epsilon, sigma, steps, seconds, d, signal, noise)


def sweep(
    settings: Iterable[RunSetting],
    train: Tensors,
    test: Tensors,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    model_fn: Callable[[RunSetting, int], nn.Module] | None = None,
    progress: bool | None = None,
    device: torch.device | str | None = None,
) -> list[RunResult]:
    """:func:`train_run` for every setting and seed, in that order (``progress``: a bar; ``None``: on a terminal)."""
    jobs = [(s, seed) for s in settings for seed in seeds]
    results = []
    with tqdm(total=len(jobs), desc="sweep", unit="run", disable=not show_progress(progress), leave=False) as bar:
        for s, seed in jobs:
            result = train_run(s, train, test, seed=seed, model_fn=model_fn, device=device)
            results.append(result)
            bar.update(1)
            bar.set_postfix(accuracy=f"{result.accuracy:.1%}", ε=f"{result.epsilon:.3g}", refresh=False)
    return results


@dataclass(frozen=True)
class Summary:
    """One group of runs: the accuracies' ``mean``, ``std`` (0 for one run) and ``n``, the largest ``epsilon``.

    ``key`` is what ``by`` gave; ``noise_multiplier`` is the first run's sigma.
    """

    key: Hashable
    mean: float
    std: float
    n: int
    epsilon: float
    noise_multiplier: float


def summarise(results: Iterable[RunResult], by: str | Callable[[RunSetting], Hashable]) -> list[Summary]:
    """Group runs by a setting's field (``by="epsilon"``) or by ``by(setting)``, in order of first appearance.

    >>> runs = [RunResult(RunSetting(), seed, acc, 1.0, 2.0, 10, 0.1) for seed, acc in enumerate([0.8, 0.9])]
    >>> summary, = summarise(runs, by="batch_size")
    >>> summary.key, round(summary.mean, 3), round(summary.std, 4), summary.n
    (64, 0.85, 0.0707, 2)
    """
    key_of = (lambda s: getattr(s, by)) if isinstance(by, str) else by
    groups: dict[Hashable, list[RunResult]] = defaultdict(list)
    for r in results:
        groups[key_of(r.setting)].append(r)
    out = []
    for key, runs in groups.items():
        acc = torch.tensor([r.accuracy for r in runs], dtype=torch.float64)
        std = float(acc.std()) if len(runs) > 1 else 0.0
        out.append(
            Summary(key, float(acc.mean()), std, len(runs), max(r.epsilon for r in runs), runs[0].noise_multiplier)
        )
    return out
