"""The device the test suite runs on: ``pytest --device cuda`` (``make test-gpu``) runs the tests on a GPU.

The tests create their tensors and models without naming a device. With
``--device cuda`` the whole session runs inside :class:`TestDevice`, a default
device (as ``torch.set_default_device``) with one difference: a tensor drawn
from an explicit CPU ``torch.Generator`` (seeded test data, a data loader's
permutation) is drawn on the CPU, so it holds the same numbers as in the CPU
run, and then moved to the device. Plain ``set_default_device`` would refuse
it (a CPU generator cannot fill a CUDA tensor).

>>> import torch
>>> with TestDevice("meta"):                       # any device shows the routing
...     plain, seeded = torch.ones(2), torch.randn(2, generator=torch.Generator().manual_seed(0))
>>> plain.device.type, seeded.device.type
('meta', 'meta')
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._device import DeviceContext, _device_constructors

__all__ = ["DEVICES", "TestDevice", "no_gpu_reason"]

#: The values of ``--device``.
DEVICES = ("cpu", "cuda")


class TestDevice(DeviceContext):
    """A default device for tensor factories; a draw from a CPU generator is made on the CPU and moved."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _device_constructors() and kwargs.get("device") is None:
            generator = kwargs.get("generator")
            if generator is not None and generator.device.type != self.device.type:
                return func(*args, **kwargs).to(self.device)  # the CPU run's numbers, on the device
            kwargs["device"] = self.device
        return func(*args, **kwargs)


def no_gpu_reason() -> str | None:
    """Why ``--device cuda`` cannot run here, or ``None`` if it can.

    >>> import torch
    >>> (no_gpu_reason() is None) == torch.cuda.is_available()
    True
    """
    if torch.cuda.is_available():
        return None
    built = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return f"no CUDA GPU on this machine (torch {torch.__version__}, {built}; torch.cuda.is_available() is False)"
