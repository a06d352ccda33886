"""DP-SGD on several processes (and machines) with ``torch.distributed``.

One logical DP-SGD step over ``world_size`` ranks:

1. each rank draws its share of one global Poisson batch at the global rate ``q``
   (:mod:`~dpnotebook.privacy.distributed_sampler`);
2. each rank computes and clips the per-sample gradients of its own samples, in
   any mode, with virtual steps if it likes, into its local clipped sum;
3. rank 0 alone adds Gaussian noise of std ``sigma * C`` to its local sum;
4. one ``all_reduce`` (sum) of the flattened sums gives every rank the same
   ``sum of all clipped gradients + one noise draw``, divided by the global
   expected batch size ``q * N``; every rank then takes the same optimizer step.

Why rank 0 draws the noise: the noise is then drawn once per step by
construction, it travels in the very ``all_reduce`` that carries the signal (no
second message), and ``secure_mode`` keeps working (rank 0 draws from its OS
CSPRNG; a generator shared by all ranks would need a shared secret seed). The
other ranks never see the noise apart from the signal: they, like everyone, see
only the noisy sum. Ranks trust each other (they hold each other's data anyway).

The model is given as :class:`DPDDP` (ours; it only broadcasts rank 0's weights)
or as PyTorch's ``DistributedDataParallel``; ``make_private`` takes the model
inside either and returns it wrapped, so DDP's forward and its gradient all-reduce
never run: the gradients are all-reduced once, by the optimizer, after clipping.

A rank that raises inside a step still joins the step's ``all_reduce``, with a
flag, so every rank raises :class:`RanksFailedError`; :meth:`DistributedDPOptimizer.fail_together`
does the same for errors in the forward or backward pass. A rank that dies makes
the others' ``all_reduce`` fail (gloo notices a closed connection at once), and
the process group's ``timeout`` bounds the rest.

>>> from torch import nn
>>> unwrap_distributed(nn.Linear(2, 2))[1]
False
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel

from dpnotebook.privacy._optimizer import DPOptimizer, GhostDPOptimizer
from dpnotebook.privacy.noise import draw_noise
from dpnotebook.privacy.step_stats import total_norm

__all__ = [
    "DifferentiallyPrivateDistributedDataParallel",
    "DPDDP",
    "DistributedDPOptimizer",
    "DistributedGhostDPOptimizer",
    "RanksFailedError",
    "distributed_optimizer_class",
    "unwrap_distributed",
]


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
    """Marks ``module`` for distributed DP training and gives every rank rank 0's weights.

    Unlike ``DistributedDataParallel`` it installs no gradient hooks: the DP optimizer
    all-reduces the *clipped* sums once per step. Uses the default process group.

    Args:
        module: the model (the same architecture on every rank).
    """

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
    """``(the model inside DPDDP or DistributedDataParallel, True)``, or ``(module, False)``.

    The model inside is what ``make_private`` wraps for per-sample gradients and
    returns: DDP's forward, hence its gradient all-reduce, never runs (calling the
    original DDP object afterwards is refused by the wrapper: its layers would run
    outside the wrapper's forward).
    """
    inner = getattr(module, "_module", None)
    if isinstance(inner, (DPDDP, DistributedDataParallel)):
        raise ValueError(
            f"module is a grad-sample wrapper around {type(inner).__name__}: the per-sample hooks would "
            "run inside DDP. Fix: pass the DPDDP/DistributedDataParallel model itself to make_private, "
            "which wraps the model inside it."
        )
    if isinstance(module, DPDDP):
        _require_process_group("make_private with a DPDDP model")
        return module.module, True
    if isinstance(module, DistributedDataParallel):
        _require_process_group("make_private with a DistributedDataParallel model")
        return module.module, True
    return module, False


def check_distributed_setup(distributed: bool, data_loader: Any, poisson_sampling: bool) -> None:
    """Refuse the combinations that would silently mis-scale or desynchronise a distributed run."""
    from dpnotebook.privacy.distributed_sampler import DistributedDPDataLoader

    if distributed and not poisson_sampling:
        raise ValueError(
            "poisson_sampling=False with a distributed model: each rank's fixed-size batches would be "
            "divided by a batch size that is not the global one. Fix: poisson_sampling=True."
        )
    if not distributed and isinstance(data_loader, DistributedDPDataLoader):
        raise ValueError(
            "data_loader is a DistributedDPDataLoader but module is not distributed: the clipped sums "
            "would not be all-reduced and the ranks would drift apart. Fix: wrap the model in "
            "dpnotebook.privacy.distributed.DPDDP (or DistributedDataParallel) before make_private."
        )


if TYPE_CHECKING:  # the mixin is only ever mixed into a DP optimizer, whose members it uses
    _DPOptimizerBase = DPOptimizer
else:
    _DPOptimizerBase = object


class _AllReduceMixin(_DPOptimizerBase):
    """Overrides the noisy sum of a DP optimizer: local clipped sum (+ noise on rank 0), all-reduced."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _require_process_group(type(self).__name__)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        #: examples clipped on all ranks together in the last step
        self.global_batch_size: int | None = None
        self._failure_shared = False

    def _status(self, device: torch.device, failed: bool, examples: int) -> Tensor:
        status = torch.zeros(self.world_size + 1, dtype=torch.float64, device=device)
        status[self.rank] = float(failed)
        status[-1] = float(examples)
        return status

    def _all_reduce(self, tensors: list[Tensor], status: Tensor) -> tuple[list[Tensor], Tensor]:
        """Sum ``tensors`` and ``status`` over the ranks, one flat ``all_reduce`` per dtype and device."""
        groups: dict[tuple[Any, Any], list[int]] = {}
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
        failed = [r for r in range(self.world_size) if status[r] > 0]
        if failed:
            self._failure_shared = True
            raise RanksFailedError(
                f"rank(s) {failed} raised during this DP step (see their traceback); rank {self.rank} stops "
                "too, so that no rank waits forever in a collective."
            )
        return cast(list[Tensor], reduced), status  # every index is in one group: all were set

    def _noisy_sum(
        self, summed: list[Tensor], params: list[nn.Parameter], std: float
    ) -> tuple[list[Tensor], float, float]:
        noises = draw_noise(params, std if self.rank == 0 else 0.0, self.generator, self.secure_mode)
        signal_norm, noise_norm = total_norm(summed), total_norm(noises)  # this rank's: local sum, its noise
        torch._foreach_add_(noises, [s.detach() for s in summed])
        examples = sum(int(n.shape[0]) for n in self._norms)
        device = params[0].device if params else torch.device("cpu")
        reduced, status = self._all_reduce(noises, self._status(device, False, examples))
        self.global_batch_size = int(status[-1])
        return reduced, signal_norm, noise_norm

    def _join_failed_step(self) -> None:
        """Take part in this step's all-reduce with this rank marked failed (then the caller re-raises)."""
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
        """As :meth:`~dpnotebook.privacy.DPOptimizer.add_noise`, with the all-reduce; a rank that raises here still joins it."""
        try:
            super()._finish_batch()
        except RanksFailedError:
            raise
        except BaseException:
            self._join_failed_step()
            raise

    @contextmanager
    def fail_together(self) -> Iterator[None]:
        """Run a training loop so that an error on this rank stops the other ranks with :class:`RanksFailedError`.

        The failing rank joins the pending step's all-reduce, marked failed, then re-raises.
        """
        try:
            yield
        except RanksFailedError:
            raise
        except BaseException:
            self._join_failed_step()
            raise


class DistributedDPOptimizer(_AllReduceMixin, DPOptimizer):
    """A :class:`~dpnotebook.privacy.DPOptimizer` whose clipped sums are all-reduced over the ranks, with noise added once (rank 0).

    Same arguments as :class:`~dpnotebook.privacy.DPOptimizer`; ``expected_batch_size`` is the global
    one, ``q * N``. ``last_step_stats`` describes this rank's samples (its local
    clipped sum, and the noise only on rank 0); ``global_batch_size`` counts all ranks'.
    """


class DistributedGhostDPOptimizer(_AllReduceMixin, GhostDPOptimizer):
    """:class:`DistributedDPOptimizer` for ghost mode (fast clipping): same arguments, same all-reduce."""


def distributed_optimizer_class(base: type[DPOptimizer]) -> type[DPOptimizer]:
    """The distributed version of a DP optimizer class (``DPOptimizer`` or ``GhostDPOptimizer``).

    >>> distributed_optimizer_class(DPOptimizer) is DistributedDPOptimizer
    True
    """
    versions = {DPOptimizer: DistributedDPOptimizer, GhostDPOptimizer: DistributedGhostDPOptimizer}
    if base not in versions:
        raise TypeError(f"base={base!r} has no distributed version; pass DPOptimizer or GhostDPOptimizer.")
    return versions[base]
