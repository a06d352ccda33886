"""The DP-SGD settings every benchmarked step uses, dpnotebook's and Opacus' alike.

>>> SIGMA, CLIP, LR
(1.0, 1.0, 0.05)
"""

from __future__ import annotations

#: Noise multiplier, clipping bound and learning rate of every timed step.
SIGMA, CLIP, LR = 1.0, 1.0, 0.05

__all__ = ["SIGMA", "CLIP", "LR"]
