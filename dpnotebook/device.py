"""Where a tutorial runs: the CUDA GPU when one is present, the CPU otherwise, said in one line.

>>> device = default_device(announce=False)
>>> device.type in {"cpu", "cuda"}
True
"""

from __future__ import annotations

import torch

__all__ = ["default_device"]


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
