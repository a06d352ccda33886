"""``PrivacyEngine.save_checkpoint`` and ``load_checkpoint``: a private run's checkpoint, with the engine's accountant.

The model is saved unwrapped, so the file loads into the plain model (and into
Opacus); :mod:`~dpnotebook.privacy.checkpoints` writes and reads the file.
:class:`~dpnotebook.privacy.engine.PrivacyEngine` inherits these two methods.

>>> import os, tempfile
>>> from torch import nn
>>> from dpnotebook.privacy.engine import PrivacyEngine
>>> engine, path = PrivacyEngine(accountant="rdp"), os.path.join(tempfile.mkdtemp(), "run.pt")
>>> engine.accountant.step(noise_multiplier=1.0, sample_rate=0.1)
>>> engine.save_checkpoint(path=path, module=nn.Linear(2, 1), checkpoint_dict={"epoch": 3})
>>> fresh = PrivacyEngine(accountant="rdp")
>>> fresh.load_checkpoint(path=path, module=nn.Linear(2, 1)), len(fresh.accountant)
({'epoch': 3}, 1)
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn
from torch.optim import Optimizer

from dpnotebook.privacy import checkpoints
from dpnotebook.privacy._accounting import Accountant
from dpnotebook.privacy.engine_inputs import unwrap_model

__all__ = ["EngineCheckpoints"]


class EngineCheckpoints:
    """The checkpoint methods of :class:`~dpnotebook.privacy.engine.PrivacyEngine` (they save and restore ``accountant``)."""

    accountant: Accountant

    def save_checkpoint(
        self,
        *,
        path: str | os.PathLike,
        module: nn.Module,
        optimizer: Optimizer | None = None,
        checkpoint_dict: dict[str, Any] | None = None,
        noise_scheduler: Any = None,
        grad_clip_scheduler: Any = None,
        module_state_dict_kwargs: dict[str, Any] | None = None,
        torch_save_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Save the model (unwrapped, loadable into the plain model), the optimizer and the accountant.

        Args:
            path: the file to write with ``torch.save``.
            module: the (wrapped or plain) model.
            optimizer: the optimizer, if its state should be saved too.
            checkpoint_dict: extra entries to store (epoch, ...), given back by :meth:`load_checkpoint`.
            noise_scheduler, grad_clip_scheduler: schedulers (:mod:`dpnotebook.schedulers`) to save.
            module_state_dict_kwargs, torch_save_kwargs: passed to ``state_dict()`` and ``torch.save``.
        """
        checkpoints.save_checkpoint(
            path,
            unwrap_model(module),
            self.accountant,
            optimizer=optimizer,
            checkpoint_dict=checkpoint_dict,
            noise_scheduler=noise_scheduler,
            grad_clip_scheduler=grad_clip_scheduler,
            module_state_dict_kwargs=module_state_dict_kwargs,
            torch_save_kwargs=torch_save_kwargs,
        )

    def load_checkpoint(
        self,
        *,
        path: str | os.PathLike,
        module: nn.Module,
        optimizer: Optimizer | None = None,
        map_location: Any = None,
        noise_scheduler: Any = None,
        grad_clip_scheduler: Any = None,
        module_load_dict_kwargs: dict[str, Any] | None = None,
        torch_load_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Restore what :meth:`save_checkpoint` (or Opacus') wrote; return the extra entries of ``checkpoint_dict``."""
        return checkpoints.load_checkpoint(
            path,
            unwrap_model(module),
            self.accountant,
            optimizer=optimizer,
            map_location=map_location,
            noise_scheduler=noise_scheduler,
            grad_clip_scheduler=grad_clip_scheduler,
            module_load_dict_kwargs=module_load_dict_kwargs,
            torch_load_kwargs=torch_load_kwargs,
        )
