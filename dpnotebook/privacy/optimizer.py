"""``DPOptimizer``: turn any PyTorch optimizer into a DP-SGD one.

One step of DP-SGD, in the order this class does it:

1. **clip** every sample's gradient ``p.grad_sample[i]`` to norm ``<= C`` (``max_grad_norm``);
2. **accumulate**: sum the clipped gradients over the batch (and over virtual steps);
3. **add noise** ``N(0, (sigma * C)^2)`` to the sum, once per logical batch;
4. **scale** by ``1 / (expected_batch_size * passes)`` for ``loss_reduction="mean"``, ``passes`` being the
   backward passes ``p.grad_sample`` holds (``accumulated_iterations``, as in Opacus; 1 under Poisson sampling);
5. write the result into ``p.grad`` and let the wrapped optimizer take its step.

A logical batch too large for memory can be fed in physical pieces: call
:meth:`DPOptimizer.virtual_step` after each piece's ``backward()``; it clips the
piece, adds it to the running sum and frees its per-sample gradients. The next
:meth:`DPOptimizer.step` draws the noise once for the whole logical batch.

>>> import torch
>>> from torch import nn
>>> import dpnotebook
>>> model = dpnotebook.wrap_model(nn.Linear(3, 1), "hooks")
>>> opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
...                   max_grad_norm=1.0, expected_batch_size=4, generator=torch.Generator().manual_seed(0))
>>> model(torch.randn(4, 3)).sum().backward()
>>> opt.step()
>>> opt.last_step_stats.batch_size, opt.last_step_stats.noise_std
(4, 1.0)
>>> model.weight.grad_sample.shape, model.weight.summed_grad.shape   # kept until zero_grad, as in Opacus
(torch.Size([4, 1, 3]), torch.Size([1, 3]))
>>> opt.zero_grad()                                # needed before the next step (Opacus' rule too)
>>> model.weight.grad_sample is None, model.weight.summed_grad is None
(True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from dpnotebook.grad_sample._engine.accumulation import grad_sample_rows  # p.grad_sample, tensor or list
from dpnotebook.grad_sample._engine.hooks import LOSS_REDUCTIONS  # one definition for wrappers and optimizers
from dpnotebook.privacy import _step as invariants  # each invariant of the step, in one place
from dpnotebook.privacy._mechanisms import (
    CLIPPING_MODES,
    check_layer_bounds,
    clip_and_sum,
    draw_noise,
    warn_insecure_noise_once,
)
from dpnotebook.privacy._step import PrivacyKnobs, StepConstants, StepStats, total_norms
from dpnotebook.privacy.arguments import check_choice, check_positive_number
from dpnotebook.privacy.opacus_contract import OpacusOptimizerContract
from dpnotebook.privacy.sampled_batches import SampledBatches
from dpnotebook.privacy.wrapped_optimizer import WrappedOptimizer

__all__ = ["DPOptimizer"]


class DPOptimizer(PrivacyKnobs, OpacusOptimizerContract, WrappedOptimizer):
    """Wraps ``optimizer``: each :meth:`step` clips, sums, adds noise, scales, then steps.

    It reads ``p.grad_sample`` (filled by a model from :func:`dpnotebook.wrap_model`)
    and overwrites ``p.grad`` with the private gradient. Everything else
    (``param_groups``, ``state``, learning-rate schedulers, ``state_dict``) is the
    wrapped optimizer's (:class:`~dpnotebook.privacy.wrapped_optimizer.WrappedOptimizer`).

    Args:
        optimizer: any ``torch.optim.Optimizer`` over the model's parameters.
        noise_multiplier: sigma (>= 0); the noise std is ``sigma * max_grad_norm``.
        max_grad_norm: C (> 0), the bound on each sample's gradient norm (or, with ``clipping="per_layer"``,
            Opacus' list of per-layer bounds; ``max_grad_norm`` is then their total).
        expected_batch_size: the expected number of samples per logical batch
            (``sample_rate * dataset_size``); the noisy sum is divided by it for
            ``loss_reduction="mean"``. Dividing by the *expected* size, not the
            drawn one, keeps the batch size itself private.
        loss_reduction: ``"mean"`` or ``"sum"``, as the model's wrapper was told.
        clipping: ``"flat"`` or ``"per_layer"`` (see ``dpnotebook.privacy._mechanisms``).
        generator: a ``torch.Generator`` for the noise (seed it to reproduce a run).
        secure_mode: ``True`` draws the noise from the OS CSPRNG (no ``generator`` then);
            ``False`` uses PyTorch's generator, as chosen; ``None`` (the default) uses it too,
            and warns once per process (:class:`~dpnotebook.errors.PrivacyWarning`) unless a
            seeded ``generator`` shows the choice was made.

    The step's invariants hold whatever the caller does (``dpnotebook.privacy._step``); ``p.grad_sample`` is kept until :meth:`zero_grad`.

    Attributes:
        last_step_stats: the :class:`StepStats` of the last step (``None`` before it).
        step_hooks: functions ``hook(optimizer)`` called after every step (the
            privacy engine steps its accountant there).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        noise_multiplier: float,
        max_grad_norm: float | list[float],
        expected_batch_size: float,
        loss_reduction: str = "mean",
        clipping: str = "flat",
        generator: torch.Generator | None = None,
        secure_mode: bool | None = None,
    ) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}.")
        if secure_mode and generator is not None:
            raise ValueError(
                f"generator={generator!r} with secure_mode=True: a seeded generator is predictable. "
                "Fix: pass generator=None for secure noise, or secure_mode=False to reproduce a run."
            )
        super().__init__(optimizer)
        self.noise_multiplier = noise_multiplier
        self.max_grad_norm = check_layer_bounds(max_grad_norm, clipping)
        self.expected_batch_size = check_positive_number("expected_batch_size", expected_batch_size)
        self.loss_reduction = check_choice("loss_reduction", loss_reduction, LOSS_REDUCTIONS)
        self.clipping = check_choice("clipping", clipping, CLIPPING_MODES)
        self.generator = generator
        self.secure_mode = bool(secure_mode)
        self._insecure_unchosen = secure_mode is None and generator is None
        self.step_hooks: list[Callable[[DPOptimizer], None]] = []
        self.last_step_stats: StepStats | None = None
        self._skip_next_step = False
        self.sampled_batches = SampledBatches()
        self._dp_model: nn.Module | None = None  # the wrapped model, when make_private says which
        self._reset_accumulation()
        invariants.claim_parameters(self, [p for group in self.param_groups for p in group["params"]])

    # -- DP-SGD ---------------------------------------------------------------
    def _reset_accumulation(self) -> None:
        self._summed: list[Tensor] | None = None
        self._norms: list[Tensor] = []
        self._num_clipped = 0
        self._virtual_steps = 0
        self._constants: StepConstants | None = None  # read when the logical batch's first piece is clipped
        self._kept_for_next = False  # the running sum is a virtual step's: zero_grad keeps it

    def _grad_samples(self) -> list[Tensor] | None:
        """Each parameter's ``grad_sample`` rows, every backward pass's (zeros for one the batch did not reach).

        ``None`` if there are none.
        """
        params = self.params
        found = [grad_sample_rows(p) for p in params]
        present = [g for g in found if g is not None]
        if not present:
            if any(p.grad is not None and bool(p.grad.any()) for p in params):
                raise RuntimeError(
                    "The parameters have .grad but no .grad_sample, so the gradients cannot be "
                    "clipped per sample. Fix: wrap the model with PrivacyEngine.make_private or "
                    "dpnotebook.wrap_model before the forward pass."
                )
            return None
        rows = present[0].shape[0]
        return [g if g is not None else p.new_zeros((rows, *p.shape)) for p, g in zip(params, found, strict=True)]

    def _clip_and_sum(self) -> tuple[list[Tensor], Tensor, int] | None:
        """``(clipped sums in self.params order, per-sample norms, number clipped)``, or ``None`` for no samples."""
        grads = self._grad_samples()
        if grads is None:
            return None
        result = clip_and_sum(grads, max_grad_norm=self.max_grad_norms or self.max_grad_norm, clipping=self.clipping)
        return result.summed, result.norms, round(result.fraction_clipped * result.batch_size)

    def _release(self) -> None:
        """Free what the piece just clipped (its per-sample gradients)."""
        for p in self.params:
            setattr(p, "grad_sample", None)  # the wrapper's attribute: torch's Parameter does not declare it
            p.grad = None

    def _forget_clipped(self) -> None:
        """Forget per-sample state that a piece's clipping consumed and that is not ``p.grad_sample`` (ghost)."""

    def clip_and_accumulate(self) -> None:
        """Clip the per-sample gradients present now and add them to the logical batch's sum (Opacus' method).

        The running sum is each parameter's ``p.summed_grad``; the clipped
        ``p.grad_sample`` stay (marked, so that no step clips them again) until
        :meth:`zero_grad`. The checks of ``dpnotebook.privacy._step`` run here:
        nothing already used by a step, and the logical batch's constants unchanged.
        """
        params = self.params
        invariants.check_not_consumed(params)
        if self._constants is not None:
            self._constants.check(self)
        constants = self._constants or StepConstants.of(self)
        result = self._clip_and_sum()
        self._constants = constants  # read at the first piece clipped without an error
        if result is not None:
            summed, norms, clipped = result
            self._summed = (
                summed if self._summed is None else [s + r for s, r in zip(self._summed, summed, strict=True)]
            )
            self._norms.append(norms.detach())
            self._num_clipped += clipped
            for p, s in zip(params, self._summed, strict=True):
                setattr(p, "summed_grad", s.detach())  # Opacus' attribute; torch's Parameter does not declare it
        self._virtual_steps += 1
        self._kept_for_next = False
        self.sampled_batches.rows_clipped()
        invariants.mark_clipped(params)
        self._forget_clipped()

    def virtual_step(self) -> None:
        """Clip the per-sample gradients present now, add them to the running sum and free them.

        Call it after the ``backward()`` of each physical piece of a logical
        batch; :meth:`step` then adds noise once for the whole batch.
        """
        self.clip_and_accumulate()
        self._kept_for_next = True
        self._release()

    def add_noise(self) -> None:
        """Finish the logical batch: clip what is left, add noise, scale, and write ``p.grad``.

        :meth:`step` does it; call it yourself only to inspect the private
        gradient without updating the model. The noise comes from
        :func:`~dpnotebook.privacy._mechanisms.draw_noise`.
        """
        self._finish_batch()

    def _finish_batch(self) -> None:
        """:meth:`add_noise`'s work, under a name an Opacus-style subclass does not override."""
        self.clip_and_accumulate()  # the last piece; its p.grad_sample stay until zero_grad, as in Opacus
        passes = self.accumulated_iterations  # backward passes the last piece held (1 under Poisson sampling)
        params = self.params
        invariants.check_no_raw_gradients(self.param_groups, params, invariants.models_holding(params, self._dp_model))
        self.sampled_batches.check(sum(int(n.shape[0]) for n in self._norms))
        summed = self._summed or [torch.zeros_like(p) for p in params]
        std = self.noise_multiplier * self.max_grad_norm
        if std > 0 and self._insecure_unchosen:
            self._insecure_unchosen = not warn_insecure_noise_once()
        noises, signal_norm, noise_norm = self._noisy_sum(summed, params, std)
        if self.loss_reduction == "mean":
            torch._foreach_div_(noises, float(self.expected_batch_size * passes))  # as Opacus' scale_grad
        for p, grad in zip(params, noises, strict=True):
            p.grad = grad
        invariants.mark_noised(noises)
        self.last_step_stats = StepStats.of_batch(
            self._norms,
            num_clipped=self._num_clipped,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            expected_batch_size=self.expected_batch_size,
            clipped_sum_norm=signal_norm,
            noise_norm=noise_norm,
            virtual_steps=self._virtual_steps,
        )
        self._reset_accumulation()

    def _noisy_sum(
        self, summed: list[Tensor], params: list[nn.Parameter], std: float
    ) -> tuple[list[Tensor], float, float]:
        """``(clipped sum + noise, ||clipped sum||, ||noise||)``; the distributed optimizer all-reduces here."""
        noises = draw_noise(params, std, self.generator, self.secure_mode)
        signal_norm, noise_norm = total_norms(summed, noises)  # before they are added up
        torch._foreach_add_(noises, [s.detach() for s in summed])
        return noises, signal_norm, noise_norm

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One DP-SGD step: :meth:`add_noise`, the wrapped optimizer's step, then the step hooks.

        After :meth:`signal_skip_step`, only a :meth:`virtual_step` instead.

        Args:
            closure: recomputes the loss (forward + backward), as for any optimizer.

        Returns:
            The closure's loss, or ``None``.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._skip_next_step:
            self._skip_next_step = False
            self.virtual_step()
            return loss
        self._finish_batch()
        self.original_optimizer.step()
        for hook in self.step_hooks:
            hook(self)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad``, ``p.grad_sample`` and, unless a virtual step left it, ``p.summed_grad``.

        The clipped sum of earlier virtual steps (:meth:`virtual_step`, or a step after
        ``signal_skip_step``) is kept: it belongs to the logical batch that the next
        :meth:`step` completes. A sum formed by a bare :meth:`clip_and_accumulate` is
        dropped, as Opacus drops it.
        """
        sum_dropped = self._summed is not None and not self._kept_for_next
        if sum_dropped:
            self._reset_accumulation()
        self.original_optimizer.zero_grad(set_to_none=set_to_none)
        self.sampled_batches.rows_dropped(clipped_too=sum_dropped)
        for p in self.params:
            setattr(p, "grad_sample", None)  # (see _release)
            if self._summed is None:
                setattr(p, "summed_grad", None)

    def __repr__(self) -> str:
        return (
            f"DPOptimizer(noise_multiplier={self.noise_multiplier}, max_grad_norm={self.max_grad_norm}, "
            f"expected_batch_size={self.expected_batch_size}, clipping={self.clipping!r}, "
            f"secure_mode={self.secure_mode},\n  {self.original_optimizer!r})"
        )
