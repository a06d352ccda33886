"""The DP optimizers: ``DPOptimizer`` (DP-SGD over any PyTorch optimizer) and its ghost-clipping form.

One step of DP-SGD, in the order :class:`~dpnotebook.privacy.DPOptimizer` does it:

1. **clip** every sample's gradient ``p.grad_sample[i]`` to norm ``<= C`` (``max_grad_norm``);
2. **accumulate**: sum the clipped gradients over the batch (and over virtual steps);
3. **add noise** ``N(0, (sigma * C)^2)`` to the sum, once per logical batch;
4. **scale** by ``1 / (expected_batch_size * passes)`` for ``loss_reduction="mean"``, ``passes`` being the
   backward passes ``p.grad_sample`` holds (:attr:`~DPOptimizer.accumulated_iterations`; 1 under Poisson
   sampling);
5. write the result into ``p.grad`` and let the wrapped optimizer take its step.

A logical batch too large for memory is fed in physical pieces: :meth:`DPOptimizer.virtual_step` after each
piece's ``backward()`` clips it, adds it to the running sum and frees its per-sample gradients; the next
:meth:`DPOptimizer.step` draws the noise once. :class:`GhostDPOptimizer` asks a ghost-mode model for each
sample's norm and the clip-weighted sum instead of reading ``p.grad_sample``;
:class:`DPLossFastGradientClipping` is the criterion wrapper of ``make_private(criterion=...)`` in ghost
mode. :func:`optimizer_class` maps a grad-sample mode to its optimizer class.

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
>>> model.weight.grad_sample.shape, model.weight.summed_grad.shape   # kept until zero_grad
(torch.Size([4, 1, 3]), torch.Size([1, 3]))
>>> opt.zero_grad()                                # needed before the next step
>>> model.weight.grad_sample is None, model.weight.summed_grad is None
(True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from dpnotebook.grad_sample._engine.accumulation import grad_sample_parts, grad_sample_rows
from dpnotebook.grad_sample._engine.hooks import (  # one definition for wrappers and optimizers
    LOSS_REDUCTIONS,
    GradSampleModule,
)
from dpnotebook.grad_sample.ghost._wrapper import GhostGradSampleModule, ghost_owner
from dpnotebook.modes import mode_class
from dpnotebook.privacy import _step as invariants  # each invariant of the step, in one place
from dpnotebook.privacy._arguments import check_choice, check_positive_number
from dpnotebook.privacy._batches import SampledBatches
from dpnotebook.privacy._mechanisms import (
    CLIPPING_MODES,
    check_layer_bounds,
    clip_and_sum,
    clip_factors,
    draw_noise,
    layer_bound_list,
    warn_insecure_noise_once,
)
from dpnotebook.privacy._step import PrivacyKnobs, StepConstants, StepStats, total_norms


class GradSampleWrapper(Protocol):
    """What every mode's grad-sample wrapper has; they share no base class but ``nn.Module``."""

    _module: nn.Module

    def to_standard_module(self) -> nn.Module: ...

    def allow_grad_accumulation(self) -> None: ...


def is_wrapped(module: nn.Module) -> bool:
    """Whether ``module`` is a grad-sample wrapper (from :func:`dpnotebook.wrap_model`, any mode)."""
    return isinstance(module, GradSampleModule) or callable(getattr(type(module), "to_standard_module", None))


def unwrap_model(module: nn.Module) -> nn.Module:
    """The original model inside a grad-sample wrapper (or ``module`` itself).

    >>> from torch import nn
    >>> from dpnotebook import wrap_model
    >>> layer = nn.Linear(2, 2)
    >>> unwrap_model(wrap_model(layer, "hooks")) is layer, unwrap_model(layer) is layer
    (True, True)
    """
    return cast(GradSampleWrapper, module)._module if is_wrapped(module) else module


def as_wrapper(module: nn.Module) -> GradSampleWrapper:
    """``module``, a wrapper from :func:`dpnotebook.wrap_model` (any mode), typed as one."""
    assert is_wrapped(module), f"{type(module).__name__} is not a grad-sample wrapper"
    return cast(GradSampleWrapper, module)


class WrappedOptimizer(Optimizer):
    """Forwards ``param_groups``, ``state``, ``defaults``, ``state_dict`` and unknown attributes to ``optimizer``.

    A DP optimizer changes only what ``step`` does to the gradients; everything else stays the wrapped
    optimizer's, so schedulers and checkpoints see one optimizer. ``Optimizer.__init__`` is not called: the
    wrapper keeps no state of its own.

    >>> sgd = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1)
    >>> wrapped = WrappedOptimizer(sgd)
    >>> wrapped.param_groups[0]["lr"] = 0.05             # a scheduler's write reaches the wrapped optimizer
    >>> sgd.param_groups[0]["lr"]
    0.05

    Args:
        optimizer: any ``torch.optim.Optimizer``.

    Attributes:
        original_optimizer: the wrapped optimizer.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        self.original_optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.original_optimizer.param_groups = value

    @property
    def state(self) -> Any:
        return self.original_optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.original_optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.original_optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.original_optimizer.defaults = value

    def __getattr__(self, name: str) -> Any:
        if name == "original_optimizer":  # not set yet: do not recurse
            raise AttributeError(name)
        return getattr(self.original_optimizer, name)

    def state_dict(self) -> dict[str, Any]:
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.original_optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.original_optimizer.add_param_group(param_group)

    @property
    def params(self) -> list[nn.Parameter]:
        """The trainable parameters of all param groups, in order."""
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]


class DPOptimizer(PrivacyKnobs, WrappedOptimizer):
    """Wraps ``optimizer``: each :meth:`step` clips, sums, adds noise, scales, then steps.

    It reads ``p.grad_sample`` (filled by a model from :func:`dpnotebook.wrap_model`)
    and overwrites ``p.grad`` with the private gradient. Everything else
    (``param_groups``, ``state``, learning-rate schedulers, ``state_dict``) is the
    wrapped optimizer's (:class:`WrappedOptimizer`).

    Args:
        optimizer: any ``torch.optim.Optimizer`` over the model's parameters.
        noise_multiplier: sigma (>= 0); the noise std is ``sigma * max_grad_norm``.
        max_grad_norm: C (> 0), the bound on each sample's gradient norm (or, with ``clipping="per_layer"``,
            a list of per-layer bounds; ``max_grad_norm`` is then their total).
        expected_batch_size: the expected number of samples per logical batch
            (``sample_rate * dataset_size``); the noisy sum is divided by it for
            ``loss_reduction="mean"``. Dividing by the *expected* size, not the
            drawn one, keeps the batch size itself private.
        loss_reduction: ``"mean"`` or ``"sum"``, as the model's wrapper was told.
        clipping: ``"flat"`` or ``"per_layer"`` (see :mod:`dpnotebook.privacy._mechanisms`).
        generator: a ``torch.Generator`` for the noise (seed it to reproduce a run).
        secure_mode: ``True`` draws the noise from the OS CSPRNG (no ``generator`` then);
            ``False`` uses PyTorch's generator, as chosen; ``None`` (the default) uses it too,
            and warns once per process (:class:`~dpnotebook.errors.PrivacyWarning`) unless a
            seeded ``generator`` shows the choice was made.

    The step's invariants hold whatever the caller does (:mod:`~dpnotebook.privacy._step`,
    :mod:`~dpnotebook.privacy._step`); ``p.grad_sample`` is kept until :meth:`zero_grad`.

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
        """Clip the per-sample gradients present now and add them to the logical batch's sum.

        The running sum is each parameter's ``p.summed_grad``; the clipped
        ``p.grad_sample`` stay (marked, so that no step clips them again) until
        :meth:`zero_grad`. The checks of :mod:`~dpnotebook.privacy._step` run here:
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
                setattr(p, "summed_grad", s.detach())  # torch's Parameter does not declare it
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
        """:meth:`add_noise`'s work, under a name that a subclass overriding ``add_noise`` keeps."""
        self.clip_and_accumulate()  # the last piece; its p.grad_sample stay until zero_grad
        passes = self.accumulated_iterations  # backward passes the last piece held (1 under Poisson sampling)
        params = self.params
        plain = unwrap_model(self._dp_model) if self._dp_model is not None else None
        invariants.check_no_raw_gradients(self.param_groups, params, invariants.models_holding(params, plain))
        self.sampled_batches.check(sum(int(n.shape[0]) for n in self._norms))
        summed = self._summed or [torch.zeros_like(p) for p in params]
        std = self.noise_multiplier * self.max_grad_norm
        if std > 0 and self._insecure_unchosen:
            self._insecure_unchosen = not warn_insecure_noise_once()
        noises, signal_norm, noise_norm = self._noisy_sum(summed, params, std)
        if self.loss_reduction == "mean":
            torch._foreach_div_(noises, float(self.expected_batch_size * passes))
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
        dropped.
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

    # -- the step's public surface (also what code written for other DP libraries reads) --
    @property
    def grad_samples(self) -> list[Tensor]:
        """The ``grad_sample`` of each parameter that has one, every backward pass's rows in one tensor.

        A list ``p.grad_sample`` (several backward passes before one step) is concatenated, as
        :meth:`_get_flat_grad_sample` does.
        """
        found = [grad_sample_rows(p) for p in self.params]
        return [g for g in found if g is not None]

    def _get_flat_grad_sample(self, p: Tensor) -> Tensor:
        """``p.grad_sample`` as one tensor, the backward passes' rows concatenated.

        Raises:
            ValueError: ``p`` has no per-sample gradients.
        """
        if not hasattr(p, "grad_sample"):
            raise ValueError(
                "Per sample gradient not found: the parameter has no grad_sample. Fix: wrap the model "
                "(PrivacyEngine.make_private or dpnotebook.wrap_model) before the forward pass."
            )
        rows = grad_sample_rows(p)
        if rows is None:
            raise ValueError(
                "Per sample gradient is not initialized: p.grad_sample is None (no backward pass since "
                "zero_grad, or the parameter is not used by the forward pass)."
            )
        return rows

    def attach_step_hook(self, hook: Callable[[Any], None]) -> None:
        """Call ``hook(optimizer)`` after every step (the privacy engine steps its accountant so)."""
        self.step_hooks.append(hook)

    def signal_skip_step(self, do_skip: bool = True) -> None:
        """Make the next ``step()`` a ``virtual_step()`` (as ``BatchMemoryManager`` does)."""
        self._skip_next_step = do_skip

    @property
    def accumulated_iterations(self) -> int:
        """How many backward passes ``p.grad_sample`` holds: its list's length, 1 for a tensor.

        Under Poisson sampling it is 1 at every step: two batches before one step are refused.

        Raises:
            ValueError: the parameters hold different numbers of backward passes.
        """
        counts = {len(grad_sample_parts(p)) for p in self.params if getattr(p, "grad_sample", None) is not None}
        if len(counts) > 1:
            raise ValueError(
                f"Number of accumulated steps is inconsistent across parameters: {sorted(counts)} backward "
                "passes. Some parameters were not reached by every backward pass since zero_grad()."
            )
        return counts.pop() if counts else 1

    def pre_step(self, closure: Callable[[], Any] | None = None) -> bool:
        """Everything of a step but the wrapped optimizer's own ``step()``.

        After ``signal_skip_step``: clip and accumulate (a virtual step) and return ``False``.
        Otherwise clip the last piece, add the noise, scale, run the step hooks and return ``True``.
        """
        if self._skip_next_step:
            self._skip_next_step = False
            self.virtual_step()
            return False
        self._finish_batch()
        for hook in self.step_hooks:
            hook(self)
        return True

    def __repr__(self) -> str:
        return (
            f"DPOptimizer(noise_multiplier={self.noise_multiplier}, max_grad_norm={self.max_grad_norm}, "
            f"expected_batch_size={self.expected_batch_size}, clipping={self.clipping!r}, "
            f"secure_mode={self.secure_mode},\n  {self.original_optimizer!r})"
        )


def _owners_of(params: list[nn.Parameter]) -> list[GhostGradSampleModule]:
    """The ghost wrappers holding ``params``, each once."""
    owners = {id(o): o for o in (ghost_owner(p) for p in params) if o is not None}
    return list(owners.values())


class GhostDPOptimizer(DPOptimizer):
    """A :class:`~dpnotebook.privacy.DPOptimizer` for models wrapped in ghost mode (same arguments): no per-sample gradients in memory.

    Clipping asks the ghost wrapper for every sample's norm, then for the clip-factor-weighted sum of the
    gradients; noise, scaling, virtual steps, statistics and hooks are the base class's.
    The wrapper is found from the optimizer's parameters, so the model must be
    wrapped (``wrap_model(model, "ghost")``) before the first :meth:`step`.
    """

    #: Its model computes norms, not ``p.grad_sample``: ``make_private(criterion=...)`` wraps the loss.
    fast_gradient_clipping = True

    def _owners(self) -> list[GhostGradSampleModule]:
        owners = _owners_of(self.params)
        if not owners:
            raise RuntimeError(
                "GhostDPOptimizer found no ghost-mode model holding its parameters. Fix: wrap the model "
                "with dpnotebook.wrap_model(model, 'ghost') (or make_private(grad_sample_mode='ghost')) "
                "and build the optimizer from that model's parameters."
            )
        return owners

    @property
    def accumulated_iterations(self) -> int:
        """1: its model keeps norms, not a list of backward passes."""
        return 1

    def _clip_and_sum(self) -> tuple[list[Tensor], Tensor, int] | None:
        """``(clipped sums in self.params order, per-sample norms, number clipped)``, or ``None`` for no samples."""
        params = self.params
        owners = self._owners()
        if len(owners) > 1:
            raise RuntimeError(
                "GhostDPOptimizer's parameters belong to several ghost-mode models; use one optimizer per model."
            )
        model = owners[0]
        B = model.num_samples()
        if B == 0:
            return None
        sq = model.sq_norms()
        layer_sq = torch.stack([sq[p] if p in sq else p.new_zeros(B) for p in params])  # [L, B]
        norms = layer_sq.sum(0).sqrt()
        if self.clipping == "flat":
            factors = clip_factors(norms, self.max_grad_norm)
            weights: dict[nn.Parameter, Tensor] = {p: factors for p in params}
            clipped = int((factors < 1).sum())
        else:
            bounds = layer_bound_list(self.max_grad_norms or self.max_grad_norm, len(params))
            factors = torch.stack([clip_factors(n, c) for n, c in zip(layer_sq.sqrt(), bounds, strict=True)])
            weights = dict(zip(params, factors, strict=True))
            clipped = int((factors < 1).any(0).sum())
        sums = model.weighted_sums(weights)
        return [sums[p] if p in sums else torch.zeros_like(p) for p in params], norms, clipped

    def _forget_clipped(self) -> None:
        """Forget the ghost records of the piece just clipped: no later step may clip them again."""
        for model in self._owners():
            model.clear_ghost()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad``, ``p.grad_sample`` and the ghost wrapper's records."""
        super().zero_grad(set_to_none=set_to_none)
        for model in _owners_of(self.params):
            model.clear_ghost()


class DPTensorFastGradientClipping:
    """A per-sample loss whose :meth:`backward` runs the ghost-mode backward pass.

    Args:
        module: the ghost-mode model (from ``make_private(grad_sample_mode="ghost")``).
        optimizer: its optimizer.
        loss_per_sample: the loss of each row, shape ``[rows]`` (or any shape; it is reduced whole).
        loss_reduction: ``"mean"`` or ``"sum"``, as the model's wrapper was told.

    Arithmetic with numbers and other such losses (``loss / 2``, ``a + b``, ``0.5 * loss``)
    acts on the per-sample losses.
    """

    def __init__(
        self, module: nn.Module, optimizer: Any, loss_per_sample: Tensor, loss_reduction: str = "mean"
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.loss_per_sample = loss_per_sample
        self.loss_reduction = loss_reduction

    def _like(self, loss_per_sample: Tensor) -> DPTensorFastGradientClipping:
        return DPTensorFastGradientClipping(self.module, self.optimizer, loss_per_sample, self.loss_reduction)

    def _other(self, other: Any) -> Any:
        if isinstance(other, DPTensorFastGradientClipping):
            if other.loss_reduction != self.loss_reduction:
                raise ValueError(
                    f"cannot combine a loss with loss_reduction={self.loss_reduction!r} and one with "
                    f"loss_reduction={other.loss_reduction!r}. Fix: use one reduction for both criteria."
                )
            return other.loss_per_sample
        return other

    def reduced(self) -> Tensor:
        """The loss as the criterion would have reduced it (mean or sum over every element)."""
        return self.loss_per_sample.mean() if self.loss_reduction == "mean" else self.loss_per_sample.sum()

    def detach(self) -> Tensor:
        return self.reduced().detach()

    def item(self) -> float:
        return self.detach().item()

    def backward(self) -> None:
        """One backward pass of the reduced loss: the ghost wrapper records what the step needs."""
        self.reduced().backward()

    def __truediv__(self, other: Any) -> DPTensorFastGradientClipping:
        return self._like(self.loss_per_sample / self._other(other))

    def __mul__(self, other: Any) -> DPTensorFastGradientClipping:
        return self._like(self.loss_per_sample * self._other(other))

    __rmul__ = __mul__

    def __add__(self, other: Any) -> DPTensorFastGradientClipping:
        return self._like(self.loss_per_sample + self._other(other))

    __radd__ = __add__

    def __sub__(self, other: Any) -> DPTensorFastGradientClipping:
        return self._like(self.loss_per_sample - self._other(other))

    def __rsub__(self, other: Any) -> DPTensorFastGradientClipping:
        return self._like(self._other(other) - self.loss_per_sample)

    def __neg__(self) -> DPTensorFastGradientClipping:
        return self._like(-self.loss_per_sample)

    def __repr__(self) -> str:
        return f"DPTensorFastGradientClipping(loss_reduction={self.loss_reduction}, shape={self.loss_per_sample.shape})"

    def __str__(self) -> str:
        return f"DPTensorFastGradientClipping({self.item():.4f})"


class DPLossFastGradientClipping:
    """Wraps a criterion so that it returns a :class:`DPTensorFastGradientClipping`, for ghost mode.

    ``backward()`` of the wrapped loss is one ordinary backward pass: the ghost wrapper records each layer's
    activations and backprops, and :class:`GhostDPOptimizer` forms the norms and the clipped sum at
    ``step()``. So ``p.grad`` is filled by ``step()``, not by ``backward()``.

    >>> from dpnotebook import wrap_model
    >>> model = wrap_model(nn.Linear(3, 2), "ghost")
    >>> opt = GhostDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0,
    ...                        max_grad_norm=1.0, expected_batch_size=4)
    >>> loss = DPLossFastGradientClipping(model, opt, nn.CrossEntropyLoss())(model(torch.randn(4, 3)),
    ...                                                                     torch.tensor([0, 1, 1, 0]))
    >>> loss.backward(); opt.step()
    >>> loss.loss_per_sample.shape, opt.last_step_stats.batch_size
    (torch.Size([4]), 4)

    Args:
        module: the ghost-mode model.
        optimizer: its :class:`GhostDPOptimizer`.
        criterion: a loss with a ``reduction`` attribute (``nn.CrossEntropyLoss()``, ...);
            one without gets the module's.
        loss_reduction: ``"mean"`` or ``"sum"``; it must equal the criterion's, the
            module's and the optimizer's (a ``ValueError`` names the one that differs).
    """

    def __init__(self, module: nn.Module, optimizer: Any, criterion: Any, loss_reduction: str = "mean") -> None:
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"loss_reduction={loss_reduction!r} is invalid; use one of {LOSS_REDUCTIONS}.")
        if not hasattr(criterion, "reduction"):
            criterion.reduction = module.loss_reduction
        for name, value in (
            ("criterion.reduction", criterion.reduction),
            ("the module's loss_reduction", module.loss_reduction),
            ("the optimizer's loss_reduction", optimizer.loss_reduction),
        ):
            if value != loss_reduction:
                raise ValueError(
                    f"{name} is {value!r} but loss_reduction={loss_reduction!r}: the clipped step would be "
                    f"scaled wrongly. Fix: construct the criterion with reduction={loss_reduction!r} and pass "
                    f"loss_reduction={loss_reduction!r} to make_private."
                )
        self.module = module
        self.optimizer = optimizer
        self.criterion = criterion
        self.loss_reduction = loss_reduction

    def __call__(self, *args: Any, shape: tuple[int, ...] | None = None, **kwargs: Any) -> DPTensorFastGradientClipping:
        """The per-sample losses (the criterion with ``reduction="none"``), wrapped.

        Args:
            *args: the criterion's arguments (output, target).
            shape: for sequence tasks, the logits' shape ``[B, T, vocab]`` before flattening:
                the ``B*T`` losses are then reduced over ``T`` per sequence (positions equal to the
                criterion's ``ignore_index`` left out of a mean).
            **kwargs: the criterion's keyword arguments.
        """
        old = self.criterion.reduction
        self.criterion.reduction = "none"
        try:
            loss = self.criterion(*args, **kwargs)
        finally:
            self.criterion.reduction = old
        if shape is not None and loss.shape[0] == shape[0] * shape[1]:
            loss = loss.view(shape[0], shape[1])
            if self.loss_reduction == "sum":
                loss = loss.sum(dim=1)
            else:
                ignore = getattr(self.criterion, "ignore_index", None)
                targets = kwargs.get("target", args[1] if len(args) >= 2 else None)
                if ignore is not None and isinstance(targets, Tensor):
                    valid = (targets.view(shape[0], shape[1]) != ignore).sum(dim=1).clamp(min=1)
                    loss = loss.sum(dim=1) / valid
                else:
                    loss = loss.mean(dim=1)
        return DPTensorFastGradientClipping(self.module, self.optimizer, loss, self.loss_reduction)

    def __repr__(self) -> str:
        return f"DPLossFastGradientClipping({self.criterion!r}, loss_reduction={self.loss_reduction!r})"


#: The DP optimizer of each grad-sample mode that needs its own (any other mode: :class:`~dpnotebook.privacy.DPOptimizer`).
MODE_OPTIMIZERS: dict[str, type[DPOptimizer]] = {"ghost": GhostDPOptimizer}


def optimizer_class(mode: str | None) -> type[DPOptimizer]:
    """The DP optimizer class that ``make_private`` builds for a model wrapped in grad-sample ``mode``.

    >>> optimizer_class("ghost").__name__, optimizer_class("hooks").__name__, optimizer_class(None).__name__
    ('GhostDPOptimizer', 'DPOptimizer', 'DPOptimizer')

    Raises:
        ValueError: ``mode`` is not a registered grad-sample mode (the message names the registered ones).
    """
    if mode is None:
        return DPOptimizer
    mode_class(mode)  # an unknown mode is refused here
    return MODE_OPTIMIZERS.get(mode, DPOptimizer)
