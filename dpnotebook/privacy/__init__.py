"""DP-SGD in PyTorch: clipping, noise, Poisson sampling, privacy accounting and ``make_private``.

One concept per module:

* :mod:`~dpnotebook.privacy.clipping`: per-sample norms and clipping;
* :mod:`~dpnotebook.privacy.noise`: Gaussian noise, seedable or secure;
* :mod:`~dpnotebook.privacy.optimizer`: :class:`~dpnotebook.privacy.optimizer.DPOptimizer` (clip, sum, noise, scale, step);
* :mod:`~dpnotebook.privacy.step_stats`: :class:`StepStats`, what the last step did;
* :mod:`~dpnotebook.privacy.data_loader`: Poisson sampling and physical batches;
* :mod:`~dpnotebook.privacy.augmult`: augmentation multiplicity in the data loader;
* :mod:`~dpnotebook.privacy.batch_memory`: Opacus' :class:`BatchMemoryManager`;
* :mod:`~dpnotebook.privacy.accounting`: epsilon from Google's ``dp_accounting``;
* :mod:`~dpnotebook.privacy.calibration`: the noise multiplier a privacy budget allows;
* :mod:`~dpnotebook.privacy.mechanisms`: the textbook mechanisms (randomized response, Laplace,
  Gaussian), amplification by subsampling and the Gaussian's RDP, for computing privacy by hand;
* :mod:`~dpnotebook.privacy.engine`: :class:`PrivacyEngine` and ``make_private``;
* :mod:`~dpnotebook.privacy.distributed`, :mod:`~dpnotebook.privacy.distributed_sampler`,
  :mod:`~dpnotebook.privacy.distributed_launch`: DP-SGD on several processes (``DPDDP``);
* :mod:`~dpnotebook.privacy.training`: train and evaluate loops;
* :mod:`~dpnotebook.privacy.arguments`: the checks behind every error message.

>>> from dpnotebook.privacy import PrivacyEngine
>>> PrivacyEngine(accountant="rdp")
PrivacyEngine(accountant='rdp', steps=0, secure_mode=False)
"""

from dpnotebook.privacy.accounting import (
    ACCOUNTANTS,
    Accountant,
    PLDAccountant,
    RDPAccountant,
    available_accountants,
    compute_epsilon,
    create_accountant,
)
from dpnotebook.privacy.augmult import AugmultCollate, augmult_data_loader
from dpnotebook.privacy.batch_memory import BatchMemoryManager
from dpnotebook.privacy.calibration import get_noise_multiplier
from dpnotebook.privacy.clipping import (
    CLIPPING_MODES,
    ClipResult,
    clip_and_sum,
    clip_factors,
    layer_thresholds,
    per_layer_norms,
    per_sample_norms,
)
from dpnotebook.privacy.data_loader import DPDataLoader, PoissonBatchSampler, split_batch
from dpnotebook.privacy.distributed_sampler import DistributedDPDataLoader  # from_data_loader(distributed=True)
from dpnotebook.privacy.engine import PrivacyEngine, unwrap_model
from dpnotebook.privacy.noise import gaussian_noise
from dpnotebook.privacy.optimizer import DPOptimizer
from dpnotebook.privacy.step_stats import StepStats
from dpnotebook.privacy.training import evaluate, fit, train_epoch

__all__ = [
    # clipping
    "CLIPPING_MODES",
    "ClipResult",
    "clip_and_sum",
    "clip_factors",
    "layer_thresholds",
    "per_layer_norms",
    "per_sample_norms",
    # noise
    "gaussian_noise",
    # optimizer
    "DPOptimizer",
    "StepStats",
    # data
    "AugmultCollate",
    "BatchMemoryManager",
    "DPDataLoader",
    "DistributedDPDataLoader",
    "PoissonBatchSampler",
    "augmult_data_loader",
    "split_batch",
    # accounting
    "ACCOUNTANTS",
    "Accountant",
    "PLDAccountant",
    "RDPAccountant",
    "available_accountants",
    "compute_epsilon",
    "create_accountant",
    "get_noise_multiplier",
    # engine and loops
    "PrivacyEngine",
    "unwrap_model",
    "evaluate",
    "fit",
    "train_epoch",
]
