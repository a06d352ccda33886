"""The DP optimizers: ``DPOptimizer`` (DP-SGD over any PyTorch optimizer) and its ghost-clipping form.

Each :meth:`DPOptimizer.step` clips every sample's gradient to norm ``<= C``, sums them (over virtual steps
too), adds noise ``N(0, (sigma * C)^2)`` once per logical batch, divides by the expected batch size
(``"mean"``), writes ``p.grad`` and steps the wrapped optimizer. :class:`GhostDPOptimizer` asks a ghost-mode
model for the norms and the clip-weighted sum instead of reading ``p.grad_sample``.

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

import operator
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
from dpnotebook.privacy._arguments import check_choice, check_positive_number, check_unseeded
from dpnotebook.privacy._batches import SampledBatches
from dpnotebook.privacy._mechanisms import (
    CLIPPING_MODES,
    check_layer_bounds,
    clip_and_sum,
    draw_noise,
    layer_bound_list,
    masked_clip_factors,
    nonfinite_mask,
    warn_insecure_noise_once,
)
from dpnotebook.privacy._step import PrivacyKnobs, StepConstants, StepStats, SumAndNoiseNorms


class GradSampleWrapper(Protocol):
    """What every mode's grad-sample wrapper has."""

    _module: nn.Module

    def to_standard_module(self) -> nn.Module: ...

    def allow_grad_accumulation(self) -> None: ...


def is_wrapped(module: nn.Module) -> bool:
    """Whether ``module`` is a grad-sample wrapper (from :func:`dpnotebook.wrap_model`, any mode)."""
    return isinstance(module, GradSampleModule) or callable(getattr(type(module), "to_standard_module", None))


def unwrap_model(module: nn.Module) -> nn.Module:
    """The original model inside a grad-sample wrapper (or ``module`` itself).

    >>> from dpnotebook import wrap_model
    >>> layer = nn.Linear(2, 2)
    >>> unwrap_model(wrap_model(layer, "hooks")) is layer, unwrap_model(layer) is layer
    (True, True)
    """
    return cast(GradSampleWrapper, module)._module if is_wrapped(module) else module


def as_wrapper(module: nn.Module) -> GradSampleWrapper:
    """``module``, a grad-sample wrapper, typed as one."""
    assert is_wrapped(module), f"{type(module).__name__} is not a grad-sample wrapper"
    return cast(GradSampleWrapper, module)


def _forwarded(name: str) -> Any:
    """A property that reads and writes ``self.original_optimizer.<name>``."""

    def set_value(self: WrappedOptimizer, value: Any) -> None:
        setattr(self.original_optimizer, name, value)

    return property(lambda self: getattr(self.original_optimizer, name), set_value)


class WrappedOptimizer(Optimizer):
    """Forwards ``param_groups``, ``state``, ``defaults``, ``state_dict`` and unknown attributes to ``optimizer``.

    Schedulers and checkpoints see one optimizer; the wrapper keeps no state of its own.

    >>> sgd = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1)
    >>> WrappedOptimizer(sgd).param_groups[0]["lr"] = 0.05   # a scheduler's write reaches the wrapped optimizer
    >>> sgd.param_groups[0]["lr"]
    0.05
    """

    param_groups = _forwarded("param_groups")
    state = _forwarded("state")
    defaults = _forwarded("defaults")

    def __init__(self, optimizer: Optimizer) -> None:
        self.original_optimizer = optimizer

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
    """Wraps ``optimizer``: each :meth:`step` clips ``p.grad_sample``, sums, adds noise, scales, then steps.

    Args:
        optimizer: any ``torch.optim.Optimizer`` over the model's parameters.
        noise_multiplier: sigma (>= 0); the noise std is ``sigma * max_grad_norm``.
        max_grad_norm: C (> 0), or with ``clipping="per_layer"`` a list of per-layer bounds (C is their total).
        expected_batch_size: ``q * N``; the noisy sum is divided by it for ``loss_reduction="mean"``.
        loss_reduction: ``"mean"`` or ``"sum"``, as the model's wrapper was told.
        clipping: ``"flat"`` or ``"per_layer"``.
        generator: a ``torch.Generator`` for the noise (seed it to reproduce a run).
        secure_mode: ``True``: noise from the OS CSPRNG (no ``generator``); ``False``: PyTorch's generator;
            ``None``: PyTorch's, with a one-time :class:`~dpnotebook.errors.PrivacyWarning` unless seeded.

    Attributes:
        last_step_stats: the :class:`StepStats` of the last step (``None`` before it).
        step_hooks: functions ``hook(optimizer)`` called once per logical batch, when its noise is drawn
            (:meth:`step`, :meth:`pre_step` or :meth:`add_noise`): the accountant's.
        finished_batches: how many logical batches this optimizer has noised (a replayed CUDA graph's steps
            are not among them: :class:`~dpnotebook.privacy.GraphedStep` counts those).
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
        check_unseeded("generator", generator, bool(secure_mode))
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
        self._noise_drawn: list[Tensor] | None = None  # GraphedStep's: noise drawn before the step, to add
        self.finished_batches = 0  # logical batches noised (GraphedStep: a step ran outside its graph)
        self._reset_accumulation()
        invariants.claim_parameters(self, [p for group in self.param_groups for p in group["params"]])

    def _reset_accumulation(self) -> None:
        self._summed: list[Tensor] | None = None
        self._norms: list[Tensor] = []
        self._num_clipped: Tensor | int = 0  # a tensor on the gradients' device once a piece is clipped
        self._virtual_steps = 0
        self._constants: StepConstants | None = None  # read when the logical batch's first piece is clipped
        self._kept_for_next = False  # the running sum is a virtual step's: zero_grad keeps it

    def _grad_samples(self) -> list[Tensor] | None:
        """Each parameter's ``grad_sample`` rows (zeros where the batch did not reach it); ``None`` if none."""
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

    def _clip_and_sum(self) -> tuple[list[Tensor], Tensor, Tensor] | None:
        """``(clipped sums, per-sample norms, number clipped)``, or ``None`` for no samples; the count stays on
        the device (a step reads the host once, in :func:`nonfinite_mask`)."""
        grads = self._grad_samples()
        if grads is None:
            return None
        result = clip_and_sum(grads, max_grad_norm=self.max_grad_norms or self.max_grad_norm, clipping=self.clipping)
        return result.summed, result.norms, result.num_clipped

    def _release(self) -> None:
        for p in self.params:
            setattr(p, "grad_sample", None)  # the wrapper's attribute: torch's Parameter does not declare it
            p.grad = None

    def _forget_clipped(self) -> None:
        """Forget per-sample state, other than ``p.grad_sample``, that clipping consumed (ghost)."""

    def clip_and_accumulate(self) -> None:
        """Clip the per-sample gradients present now and add them to the running sum ``p.summed_grad``.

        The clipped ``p.grad_sample`` stay, marked as clipped, until :meth:`zero_grad`.
        """
        params = self.params
        if self._virtual_steps and invariants.all_clipped(params):  # clipped by this logical batch already
            return
        invariants.check_not_consumed(params)
        if self._constants is not None:
            self._constants.check(self)
        constants = self._constants or StepConstants.of(self)
        result = self._clip_and_sum()
        self._constants = constants  # read at the first piece clipped without an error
        if result is not None:
            summed, norms, clipped = result
            if self._summed is None:  # the first piece: nothing to add (no kernel)
                self._summed, self._num_clipped = summed, clipped
            else:
                self._summed = [s + r for s, r in zip(self._summed, summed, strict=True)]
                self._num_clipped = self._num_clipped + clipped
            self._norms.append(norms.detach())
            for p, s in zip(params, self._summed, strict=True):
                setattr(p, "summed_grad", s.detach())  # torch's Parameter does not declare it
        self._virtual_steps += 1
        self._kept_for_next = False
        self.sampled_batches.rows_clipped()
        invariants.mark_clipped(params)
        self._forget_clipped()

    def virtual_step(self) -> None:
        """Clip the per-sample gradients present now, add them to the running sum and free them.

        Call it after each physical piece's ``backward()``; :meth:`step` then adds noise once.
        """
        self.clip_and_accumulate()
        self._kept_for_next = True
        self._release()

    def add_noise(self) -> None:
        """Finish the logical batch: clip what is left, add noise, scale, write ``p.grad`` and run the step hooks
        (the accountant counts the noise), but do not update: ``original_optimizer.step()`` may follow."""
        self._finish_batch()

    def _finish_batch(self) -> None:
        """:meth:`add_noise`'s work, under a name a subclass overriding ``add_noise`` keeps."""
        self.clip_and_accumulate()  # the last piece; its p.grad_sample stay until zero_grad
        params = self.params
        plain = unwrap_model(self._dp_model) if self._dp_model is not None else None
        invariants.check_no_raw_gradients(self.param_groups, params, invariants.models_holding(params, plain))
        self.sampled_batches.check(sum(int(n.shape[0]) for n in self._norms))
        summed = self._summed or [torch.zeros_like(p) for p in params]
        std = self.noise_multiplier * self.max_grad_norm
        if std > 0 and self._insecure_unchosen:
            self._insecure_unchosen = not warn_insecure_noise_once()
        noises, norms = self._noisy_sum(summed, params, std)
        if self.loss_reduction == "mean":
            torch._foreach_div_(noises, self.mean_divisor)
        for p, grad in zip(params, noises, strict=True):
            p.grad = grad
        invariants.mark_noised(noises)
        self.last_step_stats = StepStats.of_batch(
            self._norms,
            num_clipped=self._num_clipped,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            expected_batch_size=self.expected_batch_size,
            norms=norms,
            virtual_steps=self._virtual_steps,
        )
        self._reset_accumulation()
        self.finished_batches += 1
        for hook in self.step_hooks:  # the accountant counts where the noise is drawn, whoever asked for it
            hook(self)

    def _noisy_sum(
        self, summed: list[Tensor], params: list[nn.Parameter], std: float
    ) -> tuple[list[Tensor], SumAndNoiseNorms]:
        """``(clipped sum + noise, the norms of the clipped sum and of the noise)``.

        The noise is drawn here, or was drawn by :class:`~dpnotebook.privacy.GraphedStep` before the step (with
        the same draw, :func:`draw_noise`) into buffers that a captured step adds at every replay."""
        if self._noise_drawn is not None:
            noises = [n.clone() for n in self._noise_drawn]
        else:
            noises = draw_noise(params, std, self.generator, self.secure_mode)
        norms = SumAndNoiseNorms(summed, noises)  # before they are added up
        torch._foreach_add_(noises, [s.detach() for s in summed])
        return noises, norms

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One DP-SGD step (:meth:`add_noise` and its hooks, then the wrapped optimizer's step); returns the closure's loss.

        After :meth:`signal_skip_step`, only a :meth:`virtual_step`.
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
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad``, ``p.grad_sample`` and, unless virtual steps left it, ``p.summed_grad``."""
        sum_dropped = self._summed is not None and not self._kept_for_next
        if sum_dropped:
            self._reset_accumulation()
        self.original_optimizer.zero_grad(set_to_none=set_to_none)
        self.sampled_batches.rows_dropped(clipped_too=sum_dropped)
        for p in self.params:
            setattr(p, "grad_sample", None)
            if self._summed is None:
                setattr(p, "summed_grad", None)

    @property
    def grad_samples(self) -> list[Tensor]:
        """The ``grad_sample`` of each parameter that has one, every backward pass's rows in one tensor."""
        found = [grad_sample_rows(p) for p in self.params]
        return [g for g in found if g is not None]

    def _get_flat_grad_sample(self, p: Tensor) -> Tensor:
        """``p.grad_sample`` as one tensor, the backward passes' rows concatenated; ``ValueError`` if none."""
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
        """Call ``hook(optimizer)`` at every logical batch's noise, before the wrapped optimizer's update."""
        self.step_hooks.append(hook)

    def signal_skip_step(self, do_skip: bool = True) -> None:
        """Make the next ``step()`` a ``virtual_step()`` (as ``BatchMemoryManager`` does)."""
        self._skip_next_step = do_skip

    @property
    def mean_divisor(self) -> float:
        """What a ``loss_reduction="mean"`` step divides by: ``q * N`` (times the passes with no loader tied)."""
        # a tied loader's backward passes are pieces of one Poisson batch: two batches before a step are refused
        return float(self.expected_batch_size * (1 if self.sampled_batches.tied else self.accumulated_iterations))

    @property
    def accumulated_iterations(self) -> int:
        """How many backward passes ``p.grad_sample`` holds (1 under Poisson sampling); ``ValueError`` if mixed."""
        counts = {len(grad_sample_parts(p)) for p in self.params if getattr(p, "grad_sample", None) is not None}
        if len(counts) > 1:
            raise ValueError(
                f"Number of accumulated steps is inconsistent across parameters: {sorted(counts)} backward "
                "passes. Some parameters were not reached by every backward pass since zero_grad()."
            )
        return counts.pop() if counts else 1

    def pre_step(self, closure: Callable[[], Any] | None = None) -> bool:
        """Everything of a step but the wrapped optimizer's ``step()``; ``False`` for a virtual step."""
        if self._skip_next_step:
            self._skip_next_step = False
            self.virtual_step()
            return False
        self._finish_batch()
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
    """A :class:`~dpnotebook.privacy.DPOptimizer` for ghost-mode models (same arguments): no per-sample gradients.

    Clipping asks the ghost wrapper holding the parameters for each sample's norm, then for the
    clip-factor-weighted sum; the rest is the base class's.
    """

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

    def _clip_and_sum(self) -> tuple[list[Tensor], Tensor, Tensor] | None:
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
        finite = nonfinite_mask(norms)
        if self.clipping == "flat":
            factors = masked_clip_factors(norms, self.max_grad_norm, finite)
            weights: dict[nn.Parameter, Tensor] = {p: factors for p in params}
            clipped = (factors < 1).sum()
        else:
            bounds = layer_bound_list(self.max_grad_norms or self.max_grad_norm, len(params))
            factors = torch.stack(
                [masked_clip_factors(n, c, finite) for n, c in zip(layer_sq.sqrt(), bounds, strict=True)]
            )
            weights = dict(zip(params, factors, strict=True))
            clipped = (factors < 1).any(0).sum()
        sums = model.weighted_sums(weights, None if finite is None else ~finite)  # the finite check read the host
        return [sums[p] if p in sums else torch.zeros_like(p) for p in params], norms, clipped

    def _forget_clipped(self) -> None:
        for model in self._owners():
            model.clear_ghost()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad``, ``p.grad_sample`` and the ghost wrapper's records."""
        super().zero_grad(set_to_none=set_to_none)
        for model in _owners_of(self.params):
            model.clear_ghost()


def _arithmetic(op: Callable[[Tensor, Any], Tensor]) -> Any:
    """A binary operator of :class:`DPTensorFastGradientClipping`, acting on its per-sample losses."""

    def method(self: DPTensorFastGradientClipping, other: Any) -> DPTensorFastGradientClipping:
        return self._like(op(self.loss_per_sample, self._other(other)))

    return method


class DPTensorFastGradientClipping:
    """A per-sample loss whose :meth:`backward` runs the ghost-mode backward pass.

    Arithmetic with numbers and other such losses (``loss / 2``, ``a + b``) acts on the per-sample losses.

    Args:
        module: the ghost-mode model.
        optimizer: its optimizer.
        loss_per_sample: the loss of each row.
        loss_reduction: ``"mean"`` or ``"sum"``, as the model's wrapper was told.
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

    __truediv__ = _arithmetic(operator.truediv)
    __mul__ = __rmul__ = _arithmetic(operator.mul)
    __add__ = __radd__ = _arithmetic(operator.add)
    __sub__ = _arithmetic(operator.sub)
    __rsub__ = _arithmetic(lambda loss, other: other - loss)

    def __neg__(self) -> DPTensorFastGradientClipping:
        return self._like(-self.loss_per_sample)

    def __repr__(self) -> str:
        return f"DPTensorFastGradientClipping(loss_reduction={self.loss_reduction}, shape={self.loss_per_sample.shape})"

    def __str__(self) -> str:
        return f"DPTensorFastGradientClipping({self.item():.4f})"


class DPLossFastGradientClipping:
    """Wraps a criterion so that it returns a :class:`DPTensorFastGradientClipping`, for ghost mode.

    ``p.grad`` is filled by ``step()``, not by ``backward()``.

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
        criterion: a loss with a ``reduction`` attribute (one without gets the module's).
        loss_reduction: ``"mean"`` or ``"sum"``, equal to the criterion's, the module's and the optimizer's.
    """

    def __init__(self, module: nn.Module, optimizer: Any, criterion: Any, loss_reduction: str = "mean") -> None:
        check_choice("loss_reduction", loss_reduction, LOSS_REDUCTIONS)
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
            shape: for sequences, the logits' shape ``[B, T, vocab]``: the ``B*T`` losses are reduced over
                ``T`` per sequence (``ignore_index`` positions left out of a mean).
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


#: The DP optimizer of each grad-sample mode that needs its own (any other: DPOptimizer).
MODE_OPTIMIZERS: dict[str, type[DPOptimizer]] = {"ghost": GhostDPOptimizer}


def optimizer_class(mode: str | None) -> type[DPOptimizer]:
    """The DP optimizer class for a model wrapped in grad-sample ``mode`` (``ValueError`` for an unknown mode)."""
    if mode is None:
        return DPOptimizer
    mode_class(mode)  # an unknown mode is refused here
    return MODE_OPTIMIZERS.get(mode, DPOptimizer)
