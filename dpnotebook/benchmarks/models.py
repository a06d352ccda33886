"""The networks the benchmarks measure (same shapes as the Opacus baseline we compare with)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SampleConvNet(nn.Module):
    """The MNIST network of the Opacus README: two convolutions, two linear layers.

    >>> import torch
    >>> SampleConvNet()(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, 2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, 2)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 1)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 1)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))
