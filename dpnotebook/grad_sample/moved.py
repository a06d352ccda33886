"""Old import paths of the modules that moved into ``engine/``, ``samplers/`` and ``ghost/``.

``dpnotebook.grad_sample`` used to be one flat folder. Its modules now live by
concept; the old paths keep working until version 0.2: importing one gives the
module at its new path (the same object, so patching it patches the real one)
and warns once with that path.

>>> import sys, warnings
>>> _ = sys.modules.pop("dpnotebook.grad_sample.ghost_registry", None)  # as in a fresh interpreter
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     from dpnotebook.grad_sample.ghost_registry import register_norm_sampler
>>> register_norm_sampler.__module__
'dpnotebook.grad_sample.ghost.registry'
>>> print(caught[0].message)
dpnotebook.grad_sample.ghost_registry moved to dpnotebook.grad_sample.ghost.registry; import it from there (the old path goes in 0.2)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

_ENGINE = ["accumulation", "batch_rows", "expanded_weights", "functorch_fallback", "gsm_no_op", "hooks", "module"]
_ENGINE += ["output_batch_dim", "outside_use", "ownership", "packed", "registry", "units", "wrap_arguments"]
_SAMPLERS = ["conv", "embedding", "embedding_bag", "linear", "lora", "sample_rows"]
_NORMS = ["group_norm", "instance_norm", "layer_norm", "rms_norm"]

#: old module path -> new module path
MOVED: dict[str, str] = {
    **{f"dpnotebook.grad_sample.{m}": f"dpnotebook.grad_sample.engine.{m}" for m in _ENGINE},
    **{f"dpnotebook.grad_sample.{m}": f"dpnotebook.grad_sample.samplers.{m}" for m in _SAMPLERS},
    **{f"dpnotebook.grad_sample.{m}": "dpnotebook.grad_sample.samplers.norms" for m in _NORMS},
    "dpnotebook.grad_sample.conv_ops": "dpnotebook.grad_sample.samplers.conv",
    "dpnotebook.grad_sample._contract": "dpnotebook.grad_sample.samplers.sample_rows",
    "dpnotebook.grad_sample.ghost_conv": "dpnotebook.grad_sample.samplers.conv_norm",
    "dpnotebook.grad_sample.ghost_linear": "dpnotebook.grad_sample.samplers.linear_norm",
    "dpnotebook.grad_sample.ghost_materialised": "dpnotebook.grad_sample.samplers.materialised_norm",
    "dpnotebook.grad_sample.ghost_norms": "dpnotebook.grad_sample.samplers.linear_map_norms",
    "dpnotebook.grad_sample.ghost_rnn": "dpnotebook.grad_sample.samplers.rnn_norm",
    "dpnotebook.grad_sample.ghost_layers": "dpnotebook.grad_sample.ghost.groups",
    "dpnotebook.grad_sample.ghost_ledger": "dpnotebook.grad_sample.ghost.ledger",
    "dpnotebook.grad_sample.ghost_mode": "dpnotebook.grad_sample.ghost.mode",
    "dpnotebook.grad_sample.ghost_registry": "dpnotebook.grad_sample.ghost.registry",
    "dpnotebook.grad_sample.ghost_tap": "dpnotebook.grad_sample.ghost.tap",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and hands back the module imported from its new one."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = import_old(spec.name)
        self._spec = module.__spec__  # the import system overwrites __spec__ with the old path's
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._spec  # the module keeps its own spec; it is already executed


def import_old(old: str, stacklevel: int = 2) -> types.ModuleType:
    """The module that used to be at ``old``, with a warning naming its new path.

    ``stacklevel`` counts from the caller of ``import_old`` (2: whoever called it).
    """
    new = MOVED[old]
    message = f"{old} moved to {new}; import it from there (the old path goes in 0.2)"
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)
    return importlib.import_module(new)


def install() -> None:
    """Lets the old paths import (once per process)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
