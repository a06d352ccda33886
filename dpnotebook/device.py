"""Where a tutorial runs: the CUDA GPU when one is present, the CPU otherwise, said in one line."""

from __future__ import annotations

import torch

__all__ = ["check_device", "default_device"]


def default_device(announce: bool = True) -> torch.device:
    """The first CUDA GPU when PyTorch sees one, else the CPU; with ``announce``, prints one line naming it.

    >>> import torch
    >>> default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")  # doctest: +ELLIPSIS
    device: ...
    True
    """
    gpu = torch.cuda.is_available()
    if announce:
        print(f"device: {f'cuda ({torch.cuda.get_device_name()})' if gpu else 'cpu (no CUDA GPU found)'}", flush=True)
    return torch.device("cuda" if gpu else "cpu")


def check_device(device: torch.device | str, name: str = "device") -> torch.device:
    """``device`` (a ``torch.device`` or its name) as a ``torch.device``, refused with the fix, naming the
    argument ``name``, if it is not one this machine has.

    Raises:
        TypeError: ``device`` is neither a ``torch.device`` nor a string.
        ValueError: the name is not a device, or names a CUDA GPU PyTorch does not see.

    >>> check_device("cpu")
    device(type='cpu')
    >>> check_device("gpu")
    Traceback (most recent call last):
    ...
    ValueError: device='gpu' is not a device: pass a torch.device or its name ('cpu', 'cuda', 'cuda:1'), e.g. ...
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
