"""Per-sample work in float32 as IEEE defines it, whatever precision the forward pass or the user chose.

Under ``torch.autocast`` a norm rounded to 8 bits of mantissa can come out *smaller* than the
vector it measures, and a sample clipped with it would add more than ``max_grad_norm``. The same
happens where PyTorch lets float32 matrix products round their inputs, to TF32 (10 bits: a GPU under
``torch.set_float32_matmul_precision("high")``) or to bfloat16 (``"medium"``, also on CPUs with
bfloat16 units): a Gram norm can lose a cancelling sample's norm, and a clipped sum formed by a
product can add more than ``C``. So every recorded activation and backprop is read through
:func:`full_precision`, and the samplers, ghost norms and clipped sums run under
:func:`exact_float32`. These two functions are the whole contract.

>>> import torch
>>> full_precision(torch.ones(2, dtype=torch.bfloat16)).dtype, full_precision(torch.ones(2, dtype=torch.float64)).dtype
(torch.float32, torch.float64)
>>> with torch.autocast("cpu", dtype=torch.bfloat16), matmul_precision("medium"):
...     with exact_float32():
...         (torch.ones(2, 2) @ torch.ones(2, 2)).dtype, torch.backends.mkldnn.matmul.fp32_precision
(torch.float32, 'ieee')
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["REDUCED_DTYPES", "full_precision", "exact_float32", "matmul_precision", "rounded_matmuls"]

#: The floating types autocast computes in; per-sample work reads them as float32.
REDUCED_DTYPES = (torch.float16, torch.bfloat16)


def full_precision(x: Any) -> Any:
    """``x`` as float32 if it is a ``float16``/``bfloat16`` tensor; anything else unchanged."""
    return x.float() if isinstance(x, Tensor) and x.dtype in REDUCED_DTYPES else x


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """For the block: every autocast (CPU, CUDA) off, and float32 matrix products in IEEE float32 on every backend.

    Under PyTorch's defaults (no autocast, IEEE products: :func:`_ieee_products`) it writes nothing.
    """
    if not (torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")) and _ieee_products():
        yield
        return
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        stack.enter_context(matmul_precision("highest"))
        yield


def _ieee_products() -> bool:
    """Whether every float32 product is IEEE: the legacy switch reads ``"highest"`` only while each backend's is."""
    try:
        return torch.get_float32_matmul_precision() == "highest"
    except RuntimeError:  # the legacy switch and a backend's own setting disagree: some product may round
        return False


def rounded_matmuls(devices: Iterable[str]) -> dict[str, str]:
    """The devices (``"cpu"``, ``"cuda"``) of ``devices`` whose float32 products may round, and to what.

    >>> rounded_matmuls(["cpu"])
    {}
    >>> with matmul_precision("medium"):
    ...     rounded_matmuls(["cpu"])
    {'cpu': 'bf16'}
    """
    found: dict[str, str] = {}
    if _ieee_products():
        return found
    for device in sorted(set(devices) & {"cpu", "cuda"}):
        setting = getattr(getattr(torch.backends, "mkldnn" if device == "cpu" else "cuda"), "matmul", None)
        if setting is not None and hasattr(setting, "fp32_precision"):
            value = setting.fp32_precision
            value = getattr(torch.backends, "fp32_precision", "none") if value == "none" else value
        elif device == "cuda":  # a torch before 2.9
            value = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
        else:
            value = {"medium": "bf16"}.get(torch.get_float32_matmul_precision(), "ieee")
        if value not in ("ieee", "none"):
            found[device] = value
    return found


@functools.cache  # looked up once: the backends do not change while the process runs
def _matmul_settings() -> list[Any]:
    """The backends' float32 matrix-product settings (CUDA's, oneDNN's on the CPU), where this torch has them."""
    found = [getattr(getattr(torch.backends, name, None), "matmul", None) for name in ("cuda", "mkldnn")]
    return [m for m in found if m is not None and hasattr(m, "fp32_precision")]


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` for the block (``"highest"``: IEEE), each setting put back.

    It writes PyTorch's legacy switch and each backend's own setting in step (torch checks that the two
    agree before some products and raises if they do not), then puts back what the user had.

    >>> with matmul_precision("medium"):
    ...     torch.backends.mkldnn.matmul.fp32_precision
    'bf16'
    """
    try:
        legacy: str | None = torch.get_float32_matmul_precision()
    except RuntimeError:  # the user's own mix of the two APIs: their backends' settings are still put back
        legacy = None
    saved = [(m, m.fp32_precision) for m in _matmul_settings()]
    tf32 = None if saved else torch.backends.cuda.matmul.allow_tf32  # a torch before the per-backend settings
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        if legacy is not None:
            torch.set_float32_matmul_precision(legacy)
        for m, value in saved:
            m.fp32_precision = value
        if tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = tf32
