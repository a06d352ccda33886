"""Privacy-utility sweeps: many small DP-SGD runs at different budgets, settings and seeds, summarised.

One run (:func:`train_run`) trains a small MLP on in-memory tensors with the
library's own pieces: Poisson batches from
:class:`~dpnotebook.privacy.PoissonBatchSampler`, per-sample
gradients in hooks mode, :class:`~dpnotebook.privacy.DPOptimizer`,
and a noise multiplier calibrated by
:func:`~dpnotebook.privacy.calibration.get_noise_multiplier` for exactly the
steps the run takes. The batches are indexed straight out of the tensors (no
``DataLoader``), which keeps a run on the digits well under a second, so a
tutorial can afford dozens of them. :func:`summarise` groups runs and gives
the mean and standard deviation over seeds, for error bars. A run's settings and
results (:class:`RunSetting`, :class:`RunResult`) are in :mod:`~dpnotebook.privacy.sweep_runs`.

>>> import torch
>>> from torch.utils.data import TensorDataset
>>> g = torch.Generator().manual_seed(0)
>>> x = torch.randn(200, 4, generator=g)
>>> data = TensorDataset(x, (x[:, 0] > 0).long())
>>> settings = [RunSetting(epsilon=None, epochs=2, batch_size=20, num_classes=2),
...             RunSetting(epsilon=4.0, epochs=2, batch_size=20, num_classes=2)]
>>> results = sweep(settings, data, data, seeds=[0, 1])
>>> [(r.setting.private, r.seed) for r in results]
[(False, 0), (False, 1), (True, 0), (True, 1)]
>>> all(r.epsilon <= 4.0 for r in results if r.setting.private)
True
>>> [s.n for s in summarise(results, by="epsilon")]
[2, 2]
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset
from tqdm.auto import tqdm

from dpnotebook.models import MLP
from dpnotebook.modes import wrap_model
from dpnotebook.privacy._data import PoissonBatchSampler
from dpnotebook.privacy._optimizer import DPOptimizer, as_wrapper
from dpnotebook.privacy._training import show_progress
from dpnotebook.privacy.accounting import compute_epsilon
from dpnotebook.privacy.calibration import get_noise_multiplier
from dpnotebook.privacy.schedule import steps_for_epochs, steps_per_epoch
from dpnotebook.privacy.sweep_runs import RunResult, RunSetting, noise_on_average

__all__ = ["RunSetting", "RunResult", "Summary", "train_run", "sweep", "summarise", "noise_on_average"]


def _tensors(data: TensorDataset | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    x, y = data.tensors if isinstance(data, TensorDataset) else data
    return x, y


def _accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def train_run(
    setting: RunSetting,
    train: TensorDataset | tuple[Tensor, Tensor],
    test: TensorDataset | tuple[Tensor, Tensor],
    *,
    seed: int = 0,
    model_fn: Callable[[RunSetting, int], nn.Module] | None = None,
    device: torch.device | str | None = None,
) -> RunResult:
    """Train one model with ``setting`` (privately or not) and measure its test accuracy.

    Args:
        setting: the hyper-parameters.
        train: the training tensors ``(inputs, labels)`` (or a ``TensorDataset`` of them).
        test: the test tensors.
        seed: seeds the initialisation (without touching the global generator), the
            Poisson batches and the noise.
        model_fn: ``model_fn(setting, in_features)`` builds the model (default: :class:`~dpnotebook.models.MLP`);
            it runs under the seed. It may hand back a model built elsewhere (a pretrained one):
            that model is trained in place. Only parameters with ``requires_grad`` are trained.
        device: where to train (e.g. :func:`dpnotebook.default_device`); by default the model's device.
            The tensors and the model move there; the noise is drawn there, from a generator seeded
            with ``seed + 1`` (so a run on a GPU draws other noise than the same run on the CPU).

    Returns:
        A :class:`RunResult`.
    """
    x, y = _tensors(train)
    n = len(x)
    q = setting.batch_size / n
    if not 0 < q <= 1:
        raise ValueError(f"batch_size={setting.batch_size} is invalid for {n} training samples: it must be <= {n}.")
    steps = steps_for_epochs(setting.epochs, steps_per_epoch(q))
    in_features = math.prod(x.shape[1:])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (model_fn or _default_model)(setting, in_features)
    if device is not None:
        model.to(device)
    where = next((p.device for p in model.parameters()), torch.device("cpu"))
    x, y = x.to(where), y.to(where)
    sigma = 0.0
    if setting.epsilon is not None:
        sigma = get_noise_multiplier(
            target_epsilon=setting.epsilon,
            target_delta=setting.delta,
            sample_rate=q,
            steps=steps,
            accountant=setting.accountant,
        )
    elif setting.noise_multiplier is not None:
        sigma = setting.noise_multiplier
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
        if dp_optimizer is not None:  # the run is private
            stats = dp_optimizer.last_step_stats
            assert stats is not None  # every batch, even an empty one, took a step
            signal += stats.clipped_sum_norm / steps
            noise += stats.noise_norm / steps
    seconds = time.perf_counter() - start
    if setting.private:
        as_wrapper(trained).to_standard_module()
    epsilon = math.inf
    if setting.private:
        epsilon = (
            compute_epsilon(
                noise_multiplier=sigma, sample_rate=q, steps=steps, delta=setting.delta, accountant=setting.accountant
            )
            if sigma > 0
            else math.inf
        )
    d = sum(p.numel() for p in params)
    x_test, y_test = _tensors(test)
    accuracy = _accuracy(model, x_test.to(where), y_test.to(where))
    return RunResult(setting, seed, accuracy, epsilon, sigma, steps, seconds, d, signal, noise)


def _default_model(setting: RunSetting, in_features: int) -> nn.Module:
    return MLP(in_features=in_features, hidden=setting.hidden, num_classes=setting.num_classes)


def sweep(
    settings: Iterable[RunSetting],
    train: TensorDataset | tuple[Tensor, Tensor],
    test: TensorDataset | tuple[Tensor, Tensor],
    *,
    seeds: Sequence[int] = (0, 1, 2),
    model_fn: Callable[[RunSetting, int], nn.Module] | None = None,
    progress: bool | None = None,
    device: torch.device | str | None = None,
) -> list[RunResult]:
    """:func:`train_run` for every setting and seed, in that order, on ``device``.

    Args:
        settings: the runs' settings.
        train: the training tensors.
        test: the test tensors.
        seeds: every setting runs once per seed.
        model_fn: as in :func:`train_run`.
        progress: show a progress bar (runs done, the last run's accuracy and epsilon); ``None``
            (the default) shows it only when stderr is a terminal
            (:func:`~dpnotebook.privacy._training.show_progress`), so that a notebook's stored
            output stays clean. Pass ``True`` for a bar in a notebook.
        device: where every run trains, as in :func:`train_run`.
    """
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
    """The runs of one group: their accuracies' mean and standard deviation (over seeds).

    Attributes:
        key: the group's key (what ``by`` gave).
        mean: the mean accuracy.
        std: the sample standard deviation (0 for a single run).
        n: the number of runs.
        epsilon: the largest epsilon spent by a run of the group.
        noise_multiplier: sigma of the group's first run.
    """

    key: Hashable
    mean: float
    std: float
    n: int
    epsilon: float
    noise_multiplier: float


def summarise(results: Iterable[RunResult], by: str | Callable[[RunSetting], Hashable]) -> list[Summary]:
    """Group runs by a setting's field (``by="epsilon"``) or by ``by(setting)``; one :class:`Summary` per group.

    Groups come in the order their first run appears.

    >>> s = RunSetting()
    >>> runs = [RunResult(s, seed, acc, 1.0, 2.0, 10, 0.1) for seed, acc in enumerate([0.8, 0.9])]
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
