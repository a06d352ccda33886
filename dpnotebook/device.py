"""Where a tutorial runs: the CUDA GPU when one is present, the CPU otherwise, said in one line.

>>> device = default_device(announce=False)
>>> device.type in {"cpu", "cuda"}
True
"""

from __future__ import annotations

import torch

__all__ = ["check_device", "default_device"]


def default_device(announce: bool = True) -> torch.device:
    """The first CUDA GPU when PyTorch sees one, else the CPU; prints which unless told not to.

    Every tutorial starts with ``device = dpnotebook.default_device()``, so the same notebook
    uses a GPU where there is one (Colab, a lab machine) and the CPU on a laptop or Binder,
    and its reader knows which of the two produced the numbers they see.

    Args:
        announce: Print one line naming the device (and the GPU's model).

    Returns:
        ``torch.device("cuda")`` or ``torch.device("cpu")``.

    >>> import torch
    >>> default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")  # doctest: +ELLIPSIS
    device: ...
    True
    """
    if torch.cuda.is_available():
        device = torch.device("cuda")
        where = f"cuda ({torch.cuda.get_device_name(device)})"
    else:
        device = torch.device("cpu")
        where = "cpu (no CUDA GPU found)"
    if announce:
        print(f"device: {where}", flush=True)
    return device


def check_device(device: torch.device | str, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device``, refused with the fix if it is not one this machine has.

    Args:
        device: a ``torch.device`` or its name (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
        name: the argument's name, for the error message.

    Raises:
        TypeError: ``device`` is neither a ``torch.device`` nor a string.
        ValueError: the name is not a device, or names a CUDA GPU PyTorch does not see.

    >>> check_device("cpu")
    device(type='cpu')
    >>> check_device("gpu")
    Traceback (most recent call last):
    ...
    ValueError: device='gpu' is not a device: pass a torch.device or its name ('cpu', 'cuda', 'cuda:1'), e.g. dpnotebook.default_device().
    """
    if isinstance(device, bool) or not isinstance(device, (torch.device, str)):
        raise TypeError(
            f"{name}={device!r} is a {type(device).__name__}: pass a torch.device or its name ('cpu', 'cuda'), "
            "e.g. dpnotebook.default_device()."
        )
    try:
        found = torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"{name}={device!r} is not a device: pass a torch.device or its name ('cpu', 'cuda', 'cuda:1'), "
            "e.g. dpnotebook.default_device()."
        ) from None
    if found.type not in ("cpu", "cuda"):
        raise ValueError(
            f"{name}={device!r}: dpnotebook trains on 'cpu' or 'cuda'. Fix: pass dpnotebook.default_device()."
        )
    if found.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (found.index or 0) >= count:
            raise ValueError(
                f"{name}={device!r}, but PyTorch sees {count} CUDA GPU(s) here. Fix: pass "
                "dpnotebook.default_device(), which picks the GPU when there is one and the CPU otherwise."
            )
    return found
