"""``PrivacyEngine``: make a model, optimizer and data loader differentially private in one call.

:meth:`PrivacyEngine.make_private` wraps the model for per-sample gradients, replaces the loader by a
Poisson :class:`~dpnotebook.privacy.DPDataLoader`, wraps the optimizer in a DP optimizer, and steps the
engine's accountant at every optimizer step.

>>> import torch
>>> from torch import nn
>>> from torch.utils.data import DataLoader, TensorDataset
>>> data = TensorDataset(torch.randn(64, 3), torch.randint(0, 2, (64,)))
>>> model = nn.Linear(3, 2)
>>> engine = PrivacyEngine(accountant="rdp")
>>> model, optimizer, loader = engine.make_private(
...     module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
...     data_loader=DataLoader(data, batch_size=16), noise_multiplier=1.0, max_grad_norm=1.0)
>>> for x, y in loader:
...     optimizer.zero_grad()
...     nn.functional.cross_entropy(model(x), y).backward()
...     optimizer.step()
>>> len(engine.accountant), 0 < engine.get_epsilon(1e-5) < 20
(4, True)
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sized
from typing import Any, cast

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from dpnotebook.errors import PrivacyWarning, UnsupportedModuleError, UnsupportedOptionError
from dpnotebook.fixers import fix
from dpnotebook.grad_sample._engine.hooks import LOSS_REDUCTIONS, check_k
from dpnotebook.modes import wrap_model as wrap_in_mode
from dpnotebook.privacy._accounting import create_accountant, get_noise_multiplier, warn_if_noise_drowns_signal
from dpnotebook.privacy._arguments import check_choice, check_delta, check_noise_multiplier, check_unseeded
from dpnotebook.privacy._data import DPDataLoader, loader_k, warn_replaced_sampling
from dpnotebook.privacy._mechanisms import CLIPPING_MODES, check_layer_bounds, check_streams_apart
from dpnotebook.privacy._optimizer import (
    DPLossFastGradientClipping,
    DPOptimizer,
    is_wrapped,
    optimizer_class,
    unwrap_model,
)
from dpnotebook.privacy._step import check_unowned, claim_parameters
from dpnotebook.validation import raise_if_problems, validate

ADAPTIVE_CLIPPING_ARGS = (
    "target_unclipped_quantile",
    "clipbound_learning_rate",
    "max_clipbound",
    "min_clipbound",
    "unclipped_num_std",
)
_WRAPPER_PREFIX = "_module."


def sample_rate_of(data_loader: DataLoader[Any]) -> float:
    """q of a data loader: its own for a :class:`DPDataLoader`, else ``1 / len(data_loader)``."""
    return data_loader.sample_rate if isinstance(data_loader, DPDataLoader) else 1 / len(data_loader)


def check_optimizer_params(module: nn.Module, optimizer: Optimizer) -> None:
    """Raise if the optimizer updates a parameter that is not ``module``'s."""
    own = {id(p) for p in module.parameters()}
    strangers = [
        f"param_groups[{g}]['params'][{i}] (shape {tuple(p.shape)})"
        for g, group in enumerate(optimizer.param_groups)
        for i, p in enumerate(group["params"])
        if id(p) not in own
    ]
    if strangers:
        raise ValueError(
            f"optimizer holds {len(strangers)} parameter(s) that are not the model's: {', '.join(strangers)}. "
            "They would be updated without clipping or noise. Fix: build the optimizer from "
            "module.parameters() of the very model passed as module=."
        )


def warn_not_poisson(sample_rate: float) -> None:
    """Warn that with ``poisson_sampling=False`` the epsilon reported is not a bound."""
    warnings.warn(
        "poisson_sampling=False: the data loader's fixed-size batches are kept, but the accountant "
        f"assumes Poisson sampling at q={sample_rate:.4g}: that epsilon is not a bound for this run. "
        "Fix: poisson_sampling=True (the default).",
        PrivacyWarning,
        stacklevel=3,
    )


def _refuse_unsupported(*, wrap_model: bool, clipping: str, rand_on_empty: bool, extra: dict[str, Any]) -> None:
    """Raise for the options of ``make_private`` refused by design, or unknown."""
    if not wrap_model:
        raise UnsupportedOptionError(
            "wrap_model=False is not supported: per-sample gradients are checked in the wrapper's forward. "
            "Fix: use the returned module (model.to_standard_module() gives the plain model back) and drop "
            "wrap_model=False."
        )
    if clipping == "adaptive" or any(k in extra for k in ADAPTIVE_CLIPPING_ARGS):
        raise UnsupportedOptionError(
            "clipping='adaptive' is not supported: its noisy count of unclipped samples spends privacy the "
            "accountant does not record. Fix: clipping='flat' (or 'per_layer') with a fixed max_grad_norm, "
            "or a grad-clip scheduler (dpnotebook.privacy.StepGradClip, ...)."
        )
    if rand_on_empty:
        raise UnsupportedOptionError(
            "rand_on_empty=True is not supported: an empty Poisson batch is zero-row tensors, a noise-only "
            "step. Fix: drop rand_on_empty."
        )
    if extra:
        raise TypeError(
            f"make_private() got unexpected keyword argument(s) {sorted(extra)}. "
            "See help(PrivacyEngine.make_private) for the arguments it accepts."
        )


def gcd_group_count(channels: int) -> int:
    """The GroupNorm group count for a replaced BatchNorm of ``channels`` channels: ``gcd(32, channels)``.

    >>> [gcd_group_count(c) for c in (3, 16, 48, 64)]
    [1, 16, 16, 32]
    """
    return math.gcd(32, channels)


def _strip_wrapper_prefix(state: dict[str, Any], module: nn.Module) -> dict[str, Any]:
    """``state`` without the wrapper's ``_module.`` key prefix, when ``module`` (the plain model) has none."""
    if state and not (state.keys() & module.state_dict().keys()) and all(k.startswith(_WRAPPER_PREFIX) for k in state):
        return {k[len(_WRAPPER_PREFIX) :]: v for k, v in state.items()}
    return state


def check_accountant_name(accountant: str) -> str:
    """``accountant`` unchanged, or a refusal for ``"gdp"`` (not a bound)."""
    if accountant == "gdp":
        raise UnsupportedOptionError(
            "accountant='gdp' is not supported: its central-limit approximation can report less epsilon "
            "than the run spent. Fix: choose one of ['pld', 'prv', 'rdp']."
        )
    return accountant


class PrivacyEngine:
    """Turns training private and keeps the privacy ledger.

    Args:
        accountant: ``"pld"``, ``"prv"`` or ``"rdp"``.
        secure_mode: ``True``: noise and batches from the OS CSPRNG; ``False``: PyTorch's generators;
            ``None``: PyTorch's, with a one-time warning that the noise is not cryptographically secure.

    Attributes:
        accountant: the :class:`~dpnotebook.privacy.Accountant` stepped by every optimizer step.
        dataset_size: N of the last data loader made private.
        sample_rate: q of the last data loader made private.
    """

    def __init__(self, *, accountant: str = "pld", secure_mode: bool | None = None) -> None:
        self.accountant = create_accountant(check_accountant_name(accountant))
        self.secure_mode = bool(secure_mode)
        self._secure_choice = secure_mode
        self.dataset_size: int | None = None
        self.sample_rate: float | None = None

    def make_private(
        self,
        *,
        module: nn.Module,
        optimizer: Optimizer,
        data_loader: DataLoader[Any],
        noise_multiplier: float,
        max_grad_norm: float | list[float],
        grad_sample_mode: str = "hooks",
        K: int = 1,
        poisson_sampling: bool = True,
        clipping: str = "flat",
        batch_first: bool = True,
        loss_reduction: str = "mean",
        noise_generator: torch.Generator | None = None,
        sampling_generator: torch.Generator | None = None,
        criterion: Any = None,
        wrap_model: bool = True,
        rand_on_empty: bool = False,
        **kwargs: Any,
    ) -> tuple[nn.Module, DPOptimizer, DataLoader[Any]] | tuple[nn.Module, DPOptimizer, Any, DataLoader[Any]]:
        """Return ``(module, optimizer, data_loader)`` ready for DP-SGD.

        Args:
            module: the model; it is wrapped by :func:`dpnotebook.wrap_model`.
            optimizer: an optimizer over ``module``'s parameters, wrapped in a DP optimizer.
            data_loader: gives ``q = 1 / len(data_loader)``; replaced by a :class:`DPDataLoader`.
            noise_multiplier: sigma (>= 0).
            max_grad_norm: C (> 0); with ``clipping="per_layer"``, also a list of per-layer bounds.
            grad_sample_mode: ``"hooks"``, ``"functorch"``, ..., ``"ghost"`` (norms only).
            K: augmented rows per sample; the loader yields ``B*K`` rows, sample-major.
            poisson_sampling: ``False`` keeps the loader, with a warning that epsilon is then not a bound.
            clipping: ``"flat"`` or ``"per_layer"``.
            batch_first: rows in dim 0 (``True``) or dim 1.
            loss_reduction: ``"mean"`` or ``"sum"``, as your loss reduces the batch.
            noise_generator: a seeded ``torch.Generator`` for reproducible noise; one seeded like the
                sampling generator (or torch's global one) is refused: the noise would reuse its numbers.
                The noise is drawn on the generator's device: for a model on a GPU, a CPU generator
                draws every parameter's noise on the CPU and copies it each step (about 7 ms per million
                parameters on 2 cores); ``torch.Generator(device="cuda")`` draws it on the GPU.
            sampling_generator: one for reproducible batches (default: the data loader's ``generator``).
            criterion: in ghost mode, the loss to wrap: the call then returns
                ``(module, optimizer, criterion, data_loader)``. Ignored in the other modes.
            wrap_model: only ``True`` (``False``, ``rand_on_empty=True`` and adaptive clipping are refused).
            rand_on_empty: only ``False``.
        """
        _refuse_unsupported(wrap_model=wrap_model, clipping=clipping, rand_on_empty=rand_on_empty, extra=kwargs)
        noise_multiplier = check_noise_multiplier(noise_multiplier)
        check_choice("clipping", clipping, CLIPPING_MODES)
        max_grad_norm = check_layer_bounds(max_grad_norm, clipping)  # a list: per-layer bounds
        check_choice("loss_reduction", loss_reduction, LOSS_REDUCTIONS)
        K = check_k(K)
        if loader_k(data_loader) not in (None, K):
            raise ValueError(
                f"K={K} but the data loader's AugmultCollate makes K={loader_k(data_loader)} rows per "
                "sample. Fix: pass the same K to both."
            )
        check_unseeded("noise_generator", noise_generator, self.secure_mode)
        check_unseeded("sampling_generator", sampling_generator, self.secure_mode)
        from dpnotebook.privacy._distributed import (
            check_distributed_setup,
            distributed_optimizer_class,
            unwrap_distributed,
        )

        module, distributed = unwrap_distributed(module)
        check_distributed_setup(distributed, data_loader, poisson_sampling)
        sampling = DPDataLoader.generator_of(data_loader, sampling_generator)
        if noise_multiplier and poisson_sampling and not self.secure_mode and not (distributed and sampling is None):
            # (no noise: nothing to keep apart; unseeded and distributed, each rank's sampler seeds its own)
            device = next(iter(module.parameters()), torch.empty(0)).device
            check_streams_apart(noise_generator, sampling, noise_device=device, distributed=distributed)
        check_optimizer_params(unwrap_model(module), optimizer)
        check_unowned(unwrap_model(module).parameters())  # one DP optimizer per model, before any hook is added
        if is_wrapped(module):
            if (module.K, module.batch_first, module.loss_reduction) != (K, batch_first, loss_reduction):
                raise ValueError(
                    f"module is already wrapped with K={module.K}, batch_first={module.batch_first}, "
                    f"loss_reduction={module.loss_reduction!r}; pass the same values to make_private."
                )
        else:
            module = wrap_in_mode(module, grad_sample_mode, K=K, batch_first=batch_first, loss_reduction=loss_reduction)

        self.dataset_size = len(cast(Sized, data_loader.dataset))  # map-style: q needs N
        sample_rate = sample_rate_of(data_loader)
        if poisson_sampling:
            if not isinstance(data_loader, DPDataLoader):  # already Poisson: nothing is replaced
                warn_replaced_sampling(data_loader)
            data_loader = DPDataLoader.from_data_loader(
                data_loader, generator=sampling_generator, secure_mode=self.secure_mode, distributed=distributed
            )
            expected_batch_size = data_loader.expected_batch_size
        else:
            warn_not_poisson(sample_rate)
            expected_batch_size = data_loader.batch_size or sample_rate * self.dataset_size
        self.sample_rate = sample_rate
        warn_if_noise_drowns_signal(noise_multiplier, expected_batch_size)
        if distributed:  # one all-gather: every rank sets up the same run, or every rank raises
            from dpnotebook.privacy._distributed import check_ranks_agree, dataset_fingerprint

            check_ranks_agree(
                sample_rate=sample_rate,
                dataset_size=self.dataset_size,
                dataset=dataset_fingerprint(data_loader.dataset),
                steps_per_epoch=len(data_loader),
                noise_multiplier=noise_multiplier,
                max_grad_norm=max_grad_norm,
                clipping=clipping,
                grad_sample_mode=getattr(module, "grad_sample_mode", None),
                K=K,
                loss_reduction=loss_reduction,
                accountant=type(self.accountant).__name__,
            )

        dp_class = optimizer_class(getattr(module, "grad_sample_mode", None))
        if distributed:
            dp_class = distributed_optimizer_class(dp_class)
        dp_optimizer = dp_class(
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            clipping=clipping,
            generator=noise_generator,
            secure_mode=self._secure_choice,
        )
        dp_optimizer._dp_model = module  # its K is one of a logical step's constants
        claim_parameters(dp_optimizer, unwrap_model(module).parameters())  # the whole model: one DP optimizer
        if isinstance(data_loader, DPDataLoader):  # each step must clip the examples of exactly one batch
            dp_optimizer.sampled_batches.tie(data_loader, module)

        def step_accountant(opt: DPOptimizer) -> None:
            self.accountant.step(noise_multiplier=opt.noise_multiplier, sample_rate=sample_rate)

        dp_optimizer.attach_step_hook(step_accountant)
        if criterion is not None and getattr(type(dp_optimizer), "fast_gradient_clipping", False):
            criterion = DPLossFastGradientClipping(module, dp_optimizer, criterion, loss_reduction)
            return module, dp_optimizer, criterion, data_loader
        return module, dp_optimizer, data_loader

    def make_private_with_epsilon(
        self,
        *,
        module: nn.Module,
        optimizer: Optimizer,
        data_loader: DataLoader[Any],
        target_epsilon: float,
        target_delta: float,
        epochs: int,
        max_grad_norm: float | list[float],
        epsilon_tolerance: float = 0.01,
        **kwargs: Any,
    ) -> tuple[nn.Module, DPOptimizer, DataLoader[Any]] | tuple[nn.Module, DPOptimizer, Any, DataLoader[Any]]:
        """As :meth:`make_private`, with the smallest sigma spending at most ``target_epsilon`` in ``epochs``.

        Sigma is calibrated for ``ceil(epochs * len(data_loader))`` steps; ``**kwargs`` go to :meth:`make_private`.
        """
        check_delta(target_delta, dataset_size=len(cast(Sized, data_loader.dataset)), name="target_delta")
        sigma = get_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=target_delta,
            sample_rate=sample_rate_of(data_loader),
            epochs=epochs,
            steps_per_epoch=len(data_loader),
            accountant=self.accountant.mechanism,
            epsilon_tolerance=epsilon_tolerance,
        )
        return self.make_private(
            module=module,
            optimizer=optimizer,
            data_loader=data_loader,
            noise_multiplier=sigma,
            max_grad_norm=max_grad_norm,
            **kwargs,
        )

    @classmethod
    def get_compatible_module(cls, module: nn.Module) -> nn.Module:
        """A repaired copy of ``module`` (BatchNorm -> ``GroupNorm(gcd(32, C), C)``); raises if problems remain.

        >>> PrivacyEngine.get_compatible_module(nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4)))[1]
        GroupNorm(4, 4, eps=1e-05, affine=True...)
        """
        fixed = fix(module, num_groups=gcd_group_count)
        if not fixed.training:
            raise UnsupportedModuleError(
                "Model needs to be in training mode: call model.train() before making it private.", []
            )
        raise_if_problems(validate(fixed))
        return fixed

    def is_compatible(self, *, module: nn.Module, optimizer: Any = None, data_loader: Any = None) -> bool:
        """Whether :func:`dpnotebook.validate` finds nothing in ``module`` (hooks mode)."""
        return not validate(module)

    def validate(self, *, module: nn.Module, optimizer: Any = None, data_loader: Any = None) -> None:
        """Raise :class:`~dpnotebook.errors.UnsupportedModuleError` listing every problem in ``module``."""
        raise_if_problems(validate(module))

    def get_epsilon(self, delta: float) -> float:
        """The epsilon spent so far at ``delta`` (warns if ``delta >= 1 / dataset size``)."""
        return self.accountant.get_epsilon(check_delta(delta, dataset_size=self.dataset_size))

    def save_checkpoint(
        self,
        *,
        path: str | os.PathLike[str],
        module: nn.Module,
        optimizer: Optimizer | None = None,
        checkpoint_dict: dict[str, Any] | None = None,
        noise_scheduler: Any = None,
        grad_clip_scheduler: Any = None,
        module_state_dict_kwargs: dict[str, Any] | None = None,
        torch_save_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Save the plain model's state, the optimizer's, the accountant's, the schedulers' and ``checkpoint_dict``.

        >>> import os, tempfile
        >>> engine, path = PrivacyEngine(accountant="rdp"), os.path.join(tempfile.mkdtemp(), "run.pt")
        >>> engine.accountant.step(noise_multiplier=1.0, sample_rate=0.1)
        >>> engine.save_checkpoint(path=path, module=nn.Linear(2, 1), checkpoint_dict={"epoch": 3})
        >>> fresh = PrivacyEngine(accountant="rdp")
        >>> fresh.load_checkpoint(path=path, module=nn.Linear(2, 1)), len(fresh.accountant)
        ({'epoch': 3}, 1)
        """
        state = dict(checkpoint_dict or {})
        state["module_state_dict"] = unwrap_model(module).state_dict(**(module_state_dict_kwargs or {}))
        for key, scheduler in (("noise", noise_scheduler), ("grad_clip", grad_clip_scheduler)):
            if scheduler is not None:
                state[f"{key}_scheduler_state_dict"] = scheduler.state_dict()
        state["privacy_accountant_state_dict"] = self.accountant.state_dict()
        if optimizer is not None:
            state["optimizer_state_dict"] = optimizer.state_dict()
        torch.save(state, path, **(torch_save_kwargs or {}))

    def load_checkpoint(
        self,
        *,
        path: str | os.PathLike[str],
        module: nn.Module,
        optimizer: Optimizer | None = None,
        map_location: Any = None,
        noise_scheduler: Any = None,
        grad_clip_scheduler: Any = None,
        module_load_dict_kwargs: dict[str, Any] | None = None,
        torch_load_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Restore what :meth:`save_checkpoint` wrote (into the plain model); return the extra entries."""
        state = torch.load(path, **{"map_location": map_location, "weights_only": True, **(torch_load_kwargs or {})})
        plain = unwrap_model(module)
        plain.load_state_dict(
            _strip_wrapper_prefix(state.pop("module_state_dict"), plain), **(module_load_dict_kwargs or {})
        )
        for key, scheduler in (("noise", noise_scheduler), ("grad_clip", grad_clip_scheduler)):
            entry = state.pop(f"{key}_scheduler_state_dict", None)
            if scheduler is not None and entry:
                scheduler.load_state_dict(entry)
        self.accountant.load_state_dict(state.pop("privacy_accountant_state_dict"))
        optimizer_state = state.pop("optimizer_state_dict", None)
        if optimizer is not None and optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        return state

    def __repr__(self) -> str:
        steps, secure = len(self.accountant), self.secure_mode
        return f"PrivacyEngine(accountant={self.accountant.mechanism!r}, steps={steps}, secure_mode={secure})"
