"""``PrivacyEngine``: make a model, optimizer and data loader differentially private in one call.

It is Opacus' API: an Opacus script changes only its import.

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

from collections.abc import Sized
from typing import Any, cast

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from dpnotebook.grad_sample._engine.hooks import check_k
from dpnotebook.modes import wrap_model as wrap_in_mode
from dpnotebook.privacy import engine_compat
from dpnotebook.privacy._accounting import create_accountant, get_noise_multiplier, warn_if_noise_drowns_signal
from dpnotebook.privacy._mechanisms import CLIPPING_MODES, check_layer_bounds
from dpnotebook.privacy._step import check_unowned
from dpnotebook.privacy.arguments import (
    check_choice,
    check_delta,
    check_noise_multiplier,
)
from dpnotebook.privacy.augmult import loader_k
from dpnotebook.privacy.data_loader import DPDataLoader
from dpnotebook.privacy.engine_checkpoints import EngineCheckpoints
from dpnotebook.privacy.engine_inputs import (
    check_optimizer_params,
    is_wrapped,
    sample_rate_of,
    unwrap_model,
    warn_not_poisson,
)
from dpnotebook.privacy.engine_optimizer import private_optimizer
from dpnotebook.privacy.optimizer import LOSS_REDUCTIONS, DPOptimizer
from dpnotebook.privacy.replaced_sampling import warn_replaced_sampling

__all__ = ["PrivacyEngine", "unwrap_model", "is_wrapped", "sample_rate_of"]


class PrivacyEngine(EngineCheckpoints):
    """Turns training private and keeps the privacy ledger.

    Args:
        accountant: the accountant's name in the registry (``"pld"``, ``"prv"``, ``"rdp"``).
        secure_mode: ``True`` draws noise and batches from the OS CSPRNG (see
            ``dpnotebook.privacy._mechanisms``); ``False`` uses PyTorch's generators, as chosen (seeded
            runs, teaching); ``None`` (the default) uses them too and warns once per process
            that the noise is not cryptographically secure.

    Attributes:
        accountant: the :class:`~dpnotebook.privacy.Accountant`
            stepped by every optimizer step.
        dataset_size: N of the last data loader made private (for the delta check).
        sample_rate: q of the last data loader made private (samples, not rows).
    """

    def __init__(self, *, accountant: str = "pld", secure_mode: bool | None = None) -> None:
        self.accountant = create_accountant(engine_compat.check_accountant_name(accountant))
        self.secure_mode = bool(secure_mode)
        self._secure_choice = secure_mode
        self.dataset_size: int | None = None
        self.sample_rate: float | None = None

    def make_private(
        self,
        *,
        module: nn.Module,
        optimizer: Optimizer,
        data_loader: DataLoader,
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
    ) -> tuple[nn.Module, DPOptimizer, DataLoader] | tuple[nn.Module, DPOptimizer, Any, DataLoader]:
        """Return ``(module, optimizer, data_loader)`` ready for DP-SGD.

        Args:
            module: the model; it is wrapped by :func:`dpnotebook.wrap_model`.
            optimizer: an optimizer over ``module``'s parameters; it is wrapped in a :class:`~dpnotebook.privacy.optimizer.DPOptimizer`.
            data_loader: its dataset and ``len`` give ``q = 1 / len(data_loader)``; with
                ``poisson_sampling`` it is replaced by a :class:`DPDataLoader`.
            noise_multiplier: sigma (>= 0).
            max_grad_norm: C (> 0); with ``clipping="per_layer"``, also Opacus' list of per-layer bounds.
            grad_sample_mode: how per-sample gradients are computed (``"hooks"``, ``"functorch"``, ...;
                ``"ghost"``: only their norms, with a :class:`~dpnotebook.privacy.ghost_optimizer.GhostDPOptimizer`).
            K: augmented rows per sample (augmentation multiplicity); the loader
                must yield ``B*K`` rows, sample-major, e.g. with
                :class:`~dpnotebook.privacy.augmult.AugmultCollate`.
                Accounting counts samples, not rows.
            poisson_sampling: sample batches as the privacy analysis assumes. With
                ``False`` the loader is kept and a :class:`~dpnotebook.errors.PrivacyWarning`
                says that the epsilon reported, computed as if batches were Poisson
                samples, is then not a bound for the shuffled, fixed-size batches used.
            clipping: ``"flat"`` or ``"per_layer"``.
            batch_first: rows in dim 0 (``True``) or dim 1.
            loss_reduction: ``"mean"`` or ``"sum"``, as your loss reduces the batch.
            noise_generator: a seeded ``torch.Generator`` for reproducible noise.
            sampling_generator: a seeded ``torch.Generator`` for reproducible batches
                (default: the data loader's own ``generator``, as in Opacus: see
                :meth:`DPDataLoader.from_data_loader`).
            criterion: with ``grad_sample_mode="ghost"``, the loss to wrap (Opacus 1.5+): the
                call then returns ``(module, optimizer, criterion, data_loader)`` with a
                :class:`~dpnotebook.privacy.ghost_loss.DPLossFastGradientClipping`. Ignored
                in the other modes, as in Opacus.
            wrap_model: Opacus' option; ``False`` is refused with the reason
                (:mod:`~dpnotebook.privacy.engine_compat`), as are ``rand_on_empty=True`` and
                adaptive clipping (``clipping="adaptive"`` and its keyword arguments).
            rand_on_empty: Opacus' option; only ``False``.
        """
        engine_compat.refuse_unsupported(
            wrap_model=wrap_model, clipping=clipping, rand_on_empty=rand_on_empty, extra=kwargs
        )
        noise_multiplier = check_noise_multiplier(noise_multiplier)
        check_choice("clipping", clipping, CLIPPING_MODES)
        max_grad_norm = check_layer_bounds(max_grad_norm, clipping)  # a list: Opacus' per-layer bounds
        check_choice("loss_reduction", loss_reduction, LOSS_REDUCTIONS)
        K = check_k(K)
        if loader_k(data_loader) not in (None, K):
            raise ValueError(
                f"K={K} but the data loader's AugmultCollate makes K={loader_k(data_loader)} rows per "
                "sample. Fix: pass the same K to both."
            )
        for name, generator in (("noise_generator", noise_generator), ("sampling_generator", sampling_generator)):
            if self.secure_mode and generator is not None:
                raise ValueError(
                    f"{name}={generator!r} with secure_mode=True: a seeded generator is predictable. "
                    f"Fix: drop {name}, or use PrivacyEngine(secure_mode=False) to reproduce a run."
                )
        from dpnotebook.privacy._distributed import check_distributed_setup, unwrap_distributed

        module, distributed = unwrap_distributed(module)  # DPDDP / DDP: the model inside, all-reduced by the optimizer
        check_distributed_setup(distributed, data_loader, poisson_sampling)
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
            from dpnotebook.privacy._distributed import check_ranks_agree

            check_ranks_agree(
                sample_rate=sample_rate,
                dataset_size=self.dataset_size,
                steps_per_epoch=len(data_loader),
                noise_multiplier=noise_multiplier,
                max_grad_norm=max_grad_norm,
                clipping=clipping,
                grad_sample_mode=getattr(module, "grad_sample_mode", None),
                K=K,
                loss_reduction=loss_reduction,
                accountant=type(self.accountant).__name__,
            )

        dp_optimizer = private_optimizer(
            optimizer,
            module=module,
            distributed=distributed,
            data_loader=data_loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            clipping=clipping,
            generator=noise_generator,
            secure_mode=self._secure_choice,
        )

        def step_accountant(opt: DPOptimizer) -> None:
            self.accountant.step(noise_multiplier=opt.noise_multiplier, sample_rate=sample_rate)

        dp_optimizer.attach_step_hook(step_accountant)
        if criterion is not None and getattr(type(dp_optimizer), "fast_gradient_clipping", False):
            criterion = engine_compat.ghost_criterion(module, dp_optimizer, criterion, loss_reduction)
            return module, dp_optimizer, criterion, data_loader
        return module, dp_optimizer, data_loader

    def make_private_with_epsilon(
        self,
        *,
        module: nn.Module,
        optimizer: Optimizer,
        data_loader: DataLoader,
        target_epsilon: float,
        target_delta: float,
        epochs: int,
        max_grad_norm: float | list[float],
        epsilon_tolerance: float = 0.01,
        **kwargs: Any,
    ) -> tuple[nn.Module, DPOptimizer, DataLoader] | tuple[nn.Module, DPOptimizer, Any, DataLoader]:
        """As :meth:`make_private`, with the smallest sigma that spends at most ``target_epsilon`` in ``epochs``.

        Sigma is calibrated for exactly the steps the returned loader runs in ``epochs``
        epochs, ``ceil(epochs * len(loader))`` (the Poisson loader keeps ``len(data_loader)``
        batches per epoch). The chosen sigma is ``optimizer.noise_multiplier``.
        ``**kwargs`` go to :meth:`make_private`.
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
        """A repaired, checked copy of ``module``, as Opacus makes it (``ModuleValidator.fix_and_validate``)."""
        return engine_compat.compatible_module(module)

    def is_compatible(self, *, module: nn.Module, optimizer: Any = None, data_loader: Any = None) -> bool:
        """Whether :func:`dpnotebook.validate` finds nothing in ``module`` (hooks mode)."""
        return not engine_compat.problems_of(module)

    def validate(self, *, module: nn.Module, optimizer: Any = None, data_loader: Any = None) -> None:
        """Raise :class:`~dpnotebook.errors.UnsupportedModuleError` listing every problem in ``module``."""
        engine_compat.raise_problems(module)

    def get_epsilon(self, delta: float) -> float:
        """The epsilon spent so far at ``delta`` (warns if ``delta >= 1 / dataset size``)."""
        return self.accountant.get_epsilon(check_delta(delta, dataset_size=self.dataset_size))

    def __repr__(self) -> str:
        return f"PrivacyEngine(accountant={self.accountant.mechanism!r}, steps={len(self.accountant)}, secure_mode={self.secure_mode})"
