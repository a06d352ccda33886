"""Interactive widgets for teaching DP deep learning (ipywidgets 8 + matplotlib).

Each explorer is a validated state (``explorer.state``, traitlets), pure plotting functions
(``dpnotebook.widgets.<name>.plots``) and thin widget wiring, driven by the library code that
trains models: :class:`GradientExplorer` (per-sample gradients, the modes agree),
:class:`ClippingExplorer` (C and the clipping bias; :func:`clipping_stats` without a widget),
:class:`NoiseExplorer` (sigma, B, C and the noise), :class:`PrivacyBudgetExplorer` (epsilon
against epochs), :class:`AugmultExplorer` (K augmented copies), :class:`TrainingMonitor` (live
curves, as a callback) and :class:`PrivacyAttackExplorer` (epsilon as an attacker's limit).

>>> from dpnotebook.widgets import ClippingExplorer
>>> ex = ClippingExplorer(backend="static")
>>> ex.set(max_grad_norm=1.0, clipping="per_layer")
>>> ex.state.clipping
'per_layer'
"""

from dpnotebook.widgets._validate import WidgetValueError
from dpnotebook.widgets.attack import PrivacyAttackExplorer
from dpnotebook.widgets.augment import augment_copies
from dpnotebook.widgets.augmult import AugmultExplorer
from dpnotebook.widgets.budget import PrivacyBudgetExplorer
from dpnotebook.widgets.clipping import ClippingExplorer, ClippingStats, clipping_stats
from dpnotebook.widgets.gradient import GradientExplorer
from dpnotebook.widgets.grads import compute_grad_samples
from dpnotebook.widgets.monitor import TrainingMonitor
from dpnotebook.widgets.noise import NoiseExplorer
from dpnotebook.widgets.toy import ToyMLP, ToyProblem, make_blobs, make_toy

__all__ = [
    "GradientExplorer",
    "ClippingExplorer",
    "NoiseExplorer",
    "PrivacyBudgetExplorer",
    "AugmultExplorer",
    "TrainingMonitor",
    "PrivacyAttackExplorer",
    "WidgetValueError",
    "compute_grad_samples",
    "clipping_stats",
    "ClippingStats",
    "augment_copies",
    "make_toy",
    "make_blobs",
    "ToyProblem",
    "ToyMLP",
]
