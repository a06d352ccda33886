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
>>> with TestDevice("meta"):
...     seed = torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(0))
>>> seed.device.type
'meta'

"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._device import DeviceContext, _device_constructors

__all__ = ["DEVICES", "TestDevice", "no_gpu_reason"]

#: The values of ``--device``.
DEVICES = ("cpu", "cuda")


class TestDevice(DeviceContext):
    """A default device for tensor factories; a draw from a CPU generator is made on the CPU and moved.

    The same holds for a draw *into* or *from* a device tensor with a CPU generator
    (``t.random_(generator=g)``, as ``DataLoader`` draws its base seed, or
    ``torch.bernoulli(p, generator=g)``): it runs on the generator's device and the result
    is copied back.
    """

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        if func in _device_constructors() and kwargs.get("device") is None:
            if generator is not None and generator.device.type != self.device.type:
                return func(*args, **kwargs).to(self.device)  # the CPU run's numbers, on the device
            kwargs["device"] = self.device
            return func(*args, **kwargs)
        if generator is not None and args and isinstance(args[0], torch.Tensor):
            target = args[0]
            if target.device.type != generator.device.type:
                in_place = getattr(func, "__name__", "").endswith("_")  # random_, uniform_, bernoulli_: overwritten
                first = torch.empty(target.shape, dtype=target.dtype, device=generator.device) if in_place else target
                moved = [a.to(generator.device) if isinstance(a, torch.Tensor) else a for a in (first, *args[1:])]
                result = func(*moved, **kwargs)
                if in_place:  # write the draw back
                    with torch.no_grad():
                        target.copy_(moved[0])
                    return target
                return result.to(target.device) if isinstance(result, torch.Tensor) else result
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
