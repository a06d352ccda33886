"""DP-SGD on several processes (and machines) with ``torch.distributed``.

Each rank draws its share of one global Poisson batch (example ``i`` belongs to rank ``i % world_size``,
kept when its uniform is below the global ``q``), clips its samples into a local sum; rank 0 alone adds
the noise, and one ``all_reduce`` gives every rank the same noisy sum, divided by the global ``q * N``.
:func:`check_ranks_agree` refuses ranks that would sample, clip, noise or count differently, and each step
refuses ranks whose sigma, C, divisor or weights (:func:`weights_checksum`) differ; a rank that raises
inside a step joins its ``all_reduce`` with a flag, so every rank raises :class:`RanksFailedError`.
See ``docs/distributed.md``.

>>> import torch
>>> s0, s1 = (DistributedPoissonBatchSampler(10, sample_rate=0.5, rank=r, world_size=2,
...                                          generator=torch.Generator().manual_seed(0)) for r in (0, 1))
>>> one = PoissonBatchSampler(10, sample_rate=0.5, generator=torch.Generator().manual_seed(0))
>>> [sorted(a + b) == c for a, b, c in zip(s0, s1, one)]
[True, True]
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Subset

from dpnotebook.privacy._data import DPDataLoader, PoissonBatchSampler
from dpnotebook.privacy._mechanisms import draw_noise, secure_uniform
from dpnotebook.privacy._optimizer import DPOptimizer, GhostDPOptimizer
from dpnotebook.privacy._step import SumAndNoiseNorms


class RanksFailedError(RuntimeError):
    """Another rank raised or stopped during a distributed DP step: this rank stops too."""


def _require_process_group(what: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{what} needs torch.distributed initialised. Fix: call torch.distributed.init_process_group("
            "backend='gloo' (CPU) or 'nccl' (GPU), timeout=...) in every process first; torchrun sets "
            "the environment it reads."
        )


class DifferentiallyPrivateDistributedDataParallel(nn.Module):
    """Marks ``module`` for distributed DP training and copies rank 0's weights (no gradient hooks, unlike DDP)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        _require_process_group("DPDDP")
        self.module = module
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


DPDDP = DifferentiallyPrivateDistributedDataParallel


def unwrap_distributed(module: nn.Module) -> tuple[nn.Module, bool]:
    """``(the model inside DPDDP or DistributedDataParallel, True)``, or ``(module, False)``."""
    inner = getattr(module, "_module", None)
    if isinstance(inner, (DPDDP, DistributedDataParallel)):
        raise ValueError(
            f"module is a grad-sample wrapper around {type(inner).__name__}: the per-sample hooks would "
            "run inside DDP. Fix: pass the DPDDP/DistributedDataParallel model itself to make_private, "
            "which wraps the model inside it."
        )
    if isinstance(module, (DPDDP, DistributedDataParallel)):
        _require_process_group(f"make_private with a {type(module).__name__} model")
        return module.module, True
    return module, False


def check_distributed_setup(distributed: bool, data_loader: Any, poisson_sampling: bool) -> None:
    """Refuse the combinations that would silently mis-scale or desynchronise a distributed run."""
    if distributed and not poisson_sampling:
        raise ValueError(
            "poisson_sampling=False with a distributed model: each rank's fixed-size batches would be "
            "divided by a batch size that is not the global one. Fix: poisson_sampling=True."
        )
    if not distributed and isinstance(data_loader, DistributedDPDataLoader):
        raise ValueError(
            "data_loader is a DistributedDPDataLoader but module is not distributed: the clipped sums "
            "would not be all-reduced and the ranks would drift apart. Fix: wrap the model in "
            "dpnotebook.privacy.DPDDP (or DistributedDataParallel) before make_private."
        )


def rank_disagreements(settings_by_rank: list[dict[str, Any]]) -> list[str]:
    """One line per setting on which the ranks differ, naming each rank's value (none if they agree).

    >>> rank_disagreements([{"q": 0.5, "K": 1}, {"q": 0.25, "K": 1}, {"q": 0.25, "K": 1}])
    ['q: rank 0: 0.5, ranks 1, 2: 0.25']
    >>> rank_disagreements([{"q": 0.5}, {"q": 0.5}])
    []
    """
    lines = []
    for name in settings_by_rank[0]:
        values = [settings.get(name) for settings in settings_by_rank]
        if any(v != values[0] for v in values):
            groups: dict[str, list[int]] = {}
            for rank, value in enumerate(values):
                groups.setdefault(repr(value), []).append(rank)
            shown = ", ".join(
                f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {v}" for v, r in groups.items()
            )
            lines.append(f"{name}: {shown}")
    return lines


def _sampled_bytes(t: Any) -> bytes:
    """The shape and at most 4,096 evenly spaced entries of an array, as bytes (float64 or int64)."""
    t = torch.as_tensor(t).detach()
    flat = t.reshape(-1)[:: max(1, t.numel() // 4096)][:4096].cpu()
    flat = flat.to(torch.float64 if flat.is_floating_point() or flat.is_complex() else torch.int64)
    return str(tuple(t.shape)).encode() + flat.numpy().tobytes()


def dataset_fingerprint(dataset: Any) -> str:
    """What the ranks compare of their datasets: type, size and, where they hold them, a digest of their examples.

    Every rank must hold the same dataset: each Poisson-samples its own shard of it. A per-rank ``Subset``
    or a per-rank slice of a ``TensorDataset`` has the same size everywhere but other examples, so each
    rank would sample a shard of its own part and never train on the rest. The digest reads a ``Subset``'s
    indices and, without loading an example, tensors in memory (a ``TensorDataset``'s, a ``.data``).

    >>> from torch.utils.data import Subset, TensorDataset
    >>> data = TensorDataset(torch.arange(6.0))
    >>> dataset_fingerprint(Subset(data, [0, 2, 4])) == dataset_fingerprint(Subset(data, [1, 3, 5]))
    False
    >>> dataset_fingerprint(data) == dataset_fingerprint(TensorDataset(torch.arange(6.0)))
    True
    """
    digest, part = hashlib.sha256(), dataset
    while isinstance(part, Subset):  # a Subset's indices, then what it selects from
        digest.update(f"Subset[{len(part)}]".encode() + _sampled_bytes(np.asarray(part.indices, dtype=np.int64)))
        part = part.dataset
    digest.update(f"{type(part).__name__}[{len(part)}]".encode())
    for array in [*getattr(part, "tensors", ()), getattr(part, "data", None)]:
        if isinstance(array, (Tensor, np.ndarray)):
            digest.update(_sampled_bytes(array))
    return f"{type(dataset).__name__} of {len(dataset)} examples #{digest.hexdigest()[:12]}"


def check_ranks_agree(**settings: Any) -> None:
    """Refuse, on every rank at once (one ``all_gather_object``), ranks whose ``settings`` differ."""
    _require_process_group("check_ranks_agree")
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, settings)
    lines = rank_disagreements(cast(list[dict[str, Any]], gathered))
    if lines:
        raise ValueError(
            "the ranks of this distributed run called make_private with different settings:\n  "
            + "\n  ".join(lines)
            + "\nEach rank would sample its examples at its own q and scale the shared noisy sum by its own "
            "q*N: the epsilon one rank reports would not bound what another rank's examples spent, and the "
            "replicas would drift apart; ranks holding different datasets (a per-rank Subset or slice) would "
            "each sample a shard of their own and never train on the rest. Fix: give every rank the same "
            "data_loader (the whole dataset with "
            "the global batch size, or a DistributedSampler of the same per-rank batch size on every rank), "
            "noise_multiplier, max_grad_norm, clipping, grad_sample_mode, K, loss_reduction and accountant."
        )


def weights_checksum(params: list[Tensor], device: torch.device) -> Tensor:
    """The sum of the parameters' squared norms, accumulated in float64, on ``device``: a checksum the ranks compare.

    Ranks that start from rank 0's weights (``DPDDP`` copies them) and apply the same noisy sum stay equal
    to the last bit; a checkpoint loaded, or a weight changed, on one rank after wrapping moves this sum.
    It is a checksum, not a comparison of every weight: it cannot see a permutation or a sign flip, nor a
    change smaller than :data:`CHECKSUM_RTOL` of the sum, nor parameters the optimizer does not update.

    >>> weights_checksum([torch.tensor([3.0, 4.0]), torch.ones(2, 2)], torch.device("cpu"))
    tensor(29., dtype=torch.float64)
    """
    if not params:
        return torch.zeros((), dtype=torch.float64, device=device)
    norms = list(torch._foreach_norm([p.detach() for p in params], 2, dtype=torch.float64))
    if len({n.device for n in norms}) > 1:  # parameters on several devices: one copy each
        norms = [n.to(device) for n in norms]
    return torch.stack(norms).to(device).square().sum()


#: The relative difference of :func:`weights_checksum` at which ranks are told apart: float64 sums formed
#: in another order (unlike devices) differ by about 1e-16 of the sum; a loaded checkpoint by far more.
CHECKSUM_RTOL = 1e-9


def weights_differ(mine: float, reference: float) -> bool:
    """Whether two ranks' :func:`weights_checksum` values differ (NaN on both ranks is no difference).

    >>> weights_differ(1.0, 1.0 + 1e-12), weights_differ(1.0, 1.001), weights_differ(float("nan"), float("nan"))
    (False, True, False)
    """
    if math.isnan(mine) or math.isnan(reference):
        return math.isnan(mine) != math.isnan(reference)
    return not math.isclose(mine, reference, rel_tol=CHECKSUM_RTOL, abs_tol=0.0)


if TYPE_CHECKING:  # the mixin is only mixed into a DP optimizer
    _DPOptimizerBase = DPOptimizer
else:
    _DPOptimizerBase = object


class _AllReduceMixin(_DPOptimizerBase):
    """Overrides the noisy sum of a DP optimizer: local clipped sum (+ noise on rank 0), all-reduced."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _require_process_group(type(self).__name__)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.global_batch_size: int | None = None
        self._failure_shared = False

    #: Each rank's slots, in order; ``weights`` is :func:`weights_checksum` of the parameters the step updates.
    STATUS = ("failed", "noise_multiplier", "max_grad_norm", "mean divisor", "weights")

    def _status(
        self, device: torch.device, failed: bool, examples: int, divisor: float = 0.0, weights: Tensor | None = None
    ) -> Tensor:
        """Per rank the :attr:`STATUS` slots (this rank's filled), then the examples clipped."""
        mine = torch.tensor([float(failed), self.noise_multiplier, self.max_grad_norm, divisor], dtype=torch.float64)
        status = torch.zeros(len(self.STATUS) * self.world_size + 1, dtype=torch.float64, device=device)
        start = len(self.STATUS) * self.rank
        status[start : start + len(mine)] = mine
        if weights is not None:  # on the device: no read here
            status[start + len(mine)] = weights
        status[-1] = float(examples)
        return status

    def _all_reduce(self, tensors: list[Tensor], status: Tensor) -> tuple[list[Tensor], int]:
        """Sum ``tensors`` and ``status`` over the ranks (one flat ``all_reduce`` per dtype); raise if they disagree."""
        groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        for i, t in enumerate(tensors):
            groups.setdefault((t.dtype, t.device), []).append(i)
        reduced: list[Tensor | None] = [None] * len(tensors)
        try:
            for members in groups.values():
                flat = _flatten_dense_tensors([tensors[i] for i in members])
                dist.all_reduce(flat)
                for i, t in zip(members, _unflatten_dense_tensors(flat, [tensors[i] for i in members]), strict=True):
                    reduced[i] = t
            dist.all_reduce(status)
        except RuntimeError as error:
            self._failure_shared = True
            raise RanksFailedError(
                f"rank {self.rank}: the all-reduce of the clipped sums failed, so another rank stopped "
                f"(raised, was killed, or timed out). Its own log has the cause. ({error})"
            ) from error
        values, n = status.tolist(), len(self.STATUS)  # one host read
        rows = [dict(zip(self.STATUS, values[n * r : n * (r + 1)], strict=True)) for r in range(self.world_size)]
        failed = [r for r, row in enumerate(rows) if row.pop("failed") > 0]
        weights = [row.pop("weights") for row in rows]  # compared with a tolerance, not exactly
        lines = rank_disagreements(rows)
        if any(weights_differ(w, weights[0]) for w in weights):
            lines += rank_disagreements([{"weights": w} for w in weights])
        disagree = "\n  ".join(lines)
        self._failure_shared |= bool(failed or disagree)
        if failed:
            raise RanksFailedError(
                f"rank(s) {failed} raised during this DP step (see their traceback); rank {self.rank} stops "
                "too, so that no rank waits forever in a collective."
            )
        if any(not line.startswith("weights:") for line in lines):  # a scheduler or checkpoint on one rank only
            raise RanksFailedError(
                f"the ranks' DP steps disagree:\n  {disagree}\nRank 0's noise fits its own sigma * C: a larger C "
                "elsewhere, or another sigma counted, would make epsilon wrong. No rank applied this step. Fix: change "
                "noise_multiplier, max_grad_norm, expected_batch_size (schedulers, checkpoints) on every rank alike."
            )
        if lines:  # the weights alone
            raise RanksFailedError(
                f"the ranks' weights differ before this DP step (the sum of the squared parameter norms):\n  "
                f"{disagree}\nEach rank would apply the same noisy sum to other weights, and the replicas would "
                "train apart, each from its own start. No rank applied this step. Fix: load a checkpoint on "
                "every rank, or before wrapping the model in DPDDP (which copies rank 0's weights to the others), "
                "and change weights on every rank alike."
            )
        return cast(list[Tensor], reduced), int(values[-1])  # every index is in one group: all were set

    def _noisy_sum(
        self, summed: list[Tensor], params: list[nn.Parameter], std: float
    ) -> tuple[list[Tensor], SumAndNoiseNorms]:
        noises = draw_noise(params, std if self.rank == 0 else 0.0, self.generator, self.secure_mode)
        norms = SumAndNoiseNorms(summed, noises)  # this rank's: local sum, its noise
        torch._foreach_add_(noises, [s.detach() for s in summed])
        examples = sum(int(n.shape[0]) for n in self._norms)
        device = params[0].device if params else torch.device("cpu")
        divisor = self.mean_divisor if self.loss_reduction == "mean" else 1.0
        weights = weights_checksum(list(params), device)
        status = self._status(device, False, examples, divisor, weights)
        reduced, self.global_batch_size = self._all_reduce(noises, status)
        return reduced, norms

    def _join_failed_step(self) -> None:
        """Join this step's all-reduce with this rank marked failed."""
        if self._failure_shared:
            return
        self._failure_shared = True
        params = self.params
        device = params[0].device if params else torch.device("cpu")
        try:
            self._all_reduce([torch.zeros_like(p) for p in params], self._status(device, True, 0))
        except RanksFailedError:
            pass

    def _finish_batch(self) -> None:
        with self.fail_together():
            super()._finish_batch()

    @contextmanager
    def fail_together(self) -> Iterator[None]:
        """Run a training loop so that an error on this rank stops the other ranks with :class:`RanksFailedError`."""
        try:
            yield
        except RanksFailedError:
            raise
        except BaseException:
            self._join_failed_step()
            raise


class DistributedDPOptimizer(_AllReduceMixin, DPOptimizer):
    """A :class:`~dpnotebook.privacy.DPOptimizer` whose clipped sums are all-reduced, noise added once (rank 0).

    Same arguments; ``expected_batch_size`` is the global ``q * N``; ``global_batch_size`` counts all ranks'.
    """


class DistributedGhostDPOptimizer(_AllReduceMixin, GhostDPOptimizer):
    """:class:`DistributedDPOptimizer` for ghost mode (fast clipping): same arguments, same all-reduce."""


def distributed_optimizer_class(base: type[DPOptimizer]) -> type[DPOptimizer]:
    """The distributed version of ``DPOptimizer`` or ``GhostDPOptimizer``."""
    versions = {DPOptimizer: DistributedDPOptimizer, GhostDPOptimizer: DistributedGhostDPOptimizer}
    if base not in versions:
        raise TypeError(f"base={base!r} has no distributed version; pass DPOptimizer or GhostDPOptimizer.")
    return versions[base]


def rank_and_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the ones given (refused if not the process group's), else the group's."""
    if rank is None or world_size is None:
        _require_process_group("distributed sampling without rank= and world_size=")
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    elif (
        dist.is_available() and dist.is_initialized() and (rank, world_size) != (dist.get_rank(), dist.get_world_size())
    ):
        raise ValueError(
            f"rank={rank}, world_size={world_size} are not this process's: rank {dist.get_rank()} of "
            f"{dist.get_world_size()}. Two processes sampling one shard put its examples in a step twice. Fix: "
            "leave rank and world_size out (the process group's are used), or pass the global RANK, not LOCAL_RANK."
        )
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} is invalid: pass the number of processes, an int >= 1.")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is invalid: pass an int in 0 .. {world_size - 1} (world_size={world_size}).")
    return rank, world_size


class DistributedPoissonBatchSampler(PoissonBatchSampler):
    """This rank's share of ``steps`` global Poisson batches; :class:`PoissonBatchSampler`'s arguments.

    Seeded alike on every rank, the shares make up the single-process batches; unseeded, it seeds a
    generator of its own from the global RNG. ``rank`` and ``world_size`` default to the process
    group's; ``shard`` holds the indices this rank may sample.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        sample_rate: float,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        secure_mode: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(
            num_samples, sample_rate=sample_rate, steps=steps, generator=generator, secure_mode=secure_mode
        )
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.shard = torch.arange(self.rank, self.num_samples, self.world_size)
        if generator is None and not secure_mode:  # not the global RNG: rank 0 draws its noise there
            self.generator = torch.Generator().manual_seed(int(torch.randint(2**62, (1,))))

    def _draw(self) -> list[int]:
        if self.secure_mode:
            return self.shard[secure_uniform(len(self.shard)) < self.sample_rate].tolist()
        uniform = torch.rand(self.num_samples, generator=self.generator, dtype=torch.float64)  # as one process
        return self.shard[uniform[self.shard] < self.sample_rate].tolist()


class DistributedDPDataLoader(DPDataLoader):
    """A :class:`~dpnotebook.privacy.DPDataLoader` that yields this rank's share of each global Poisson batch.

    Same arguments; ``sample_rate``, ``expected_batch_size`` and ``len`` are the global ones;
    ``local_expected_batch_size`` is ``q * (size of this rank's shard)``.
    """

    batch_sampler_class = DistributedPoissonBatchSampler

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        sampler = cast(DistributedPoissonBatchSampler, self.batch_sampler)  # built from batch_sampler_class
        self.rank, self.world_size = sampler.rank, sampler.world_size
        self.local_expected_batch_size = self.sample_rate * len(sampler.shard)


DPDataLoader.distributed_class = DistributedDPDataLoader
