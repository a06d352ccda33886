"""Mixed precision: per-sample work is done in float32, whatever precision the forward pass ran in.

Under ``torch.autocast`` a norm rounded to 8 bits of mantissa can come out *smaller* than the
vector it measures, and a sample clipped with it would add more than ``max_grad_norm``. So every
recorded activation and backprop is read through :func:`full_precision`, and the samplers and
ghost norms run under :func:`autocast_off`. These two functions are the whole contract.

>>> import torch
>>> full_precision(torch.ones(2, dtype=torch.bfloat16)).dtype, full_precision(torch.ones(2, dtype=torch.float64)).dtype
(torch.float32, torch.float64)
>>> with torch.autocast("cpu", dtype=torch.bfloat16):
...     with autocast_off():
...         (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
torch.float32
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["REDUCED_DTYPES", "full_precision", "autocast_off"]

#: The floating types autocast computes in; per-sample work reads them as float32.
REDUCED_DTYPES = (torch.float16, torch.bfloat16)


def full_precision(x: Any) -> Any:
    """``x`` as float32 if it is a ``float16``/``bfloat16`` tensor; anything else unchanged."""
    return x.float() if isinstance(x, Tensor) and x.dtype in REDUCED_DTYPES else x


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Switch off every autocast that is on (CPU, CUDA) for the block: its matmuls run in float32."""
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield
