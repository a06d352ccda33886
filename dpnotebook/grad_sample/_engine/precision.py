"""Mixed precision: per-sample work is done in float32, whatever precision the forward pass ran in.

Under ``torch.autocast`` a layer's inputs and its output's gradient (the
*backprops*) can be ``bfloat16`` or ``float16``. Per-sample gradients, their
norms and the clipping must not be computed in those types: a norm rounded to 8
bits of mantissa can come out *smaller* than the vector it measures, and a sample
clipped with it would add more than ``max_grad_norm`` to the sum (the noise is
calibrated to that bound). So the engine reads every recorded activation and
backprop through :func:`full_precision` (a reduced float becomes float32; every
other tensor is left as it is) and runs the samplers and the ghost norms with
autocast switched off (:func:`autocast_off`). These two functions are the whole
contract; no sampler casts on its own.

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
    """``x`` as float32 if it is a ``float16``/``bfloat16`` tensor; anything else unchanged.

    Integer tensors (token ids, offsets), float32 and float64 tensors and non-tensors pass through.
    """
    if isinstance(x, Tensor) and x.dtype in REDUCED_DTYPES:
        return x.float()
    return x


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Switch off every autocast that is on (CPU, CUDA, ...) for the block: its matmuls run in float32.

    A ``backward()`` or ``optimizer.step()`` called inside ``torch.autocast`` would otherwise
    run the samplers' einsums and the ghost norms in the reduced type.
    """
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield
