"""DP-SGD in PyTorch: clipping, noise, Poisson sampling, privacy accounting and ``make_private``.

One concept per module:

* :mod:`~dpnotebook.privacy.clipping`: per-sample norms and clipping;
* :mod:`~dpnotebook.privacy.noise`: Gaussian noise, seedable or secure;
* :class:`DPOptimizer` (clip, sum, noise, scale, step) and its ghost-clipping form;
* :mod:`~dpnotebook.privacy.step_stats`: :class:`StepStats`, what the last step did;
* :class:`DPDataLoader`, :class:`BatchMemoryManager`, :class:`AugmultCollate`: Poisson sampling, physical
  batches, augmentation multiplicity;
* :mod:`~dpnotebook.privacy.accounting`: epsilon from Google's ``dp_accounting``;
* :mod:`~dpnotebook.privacy.calibration`: the noise multiplier a privacy budget allows;
* :mod:`~dpnotebook.privacy.mechanisms`: the textbook mechanisms (randomized response, Laplace,
  Gaussian), amplification by subsampling and the Gaussian's RDP, for computing privacy by hand;
* :class:`PrivacyEngine` and ``make_private``;
* :mod:`~dpnotebook.privacy.distributed`, :mod:`~dpnotebook.privacy.distributed_sampler`,
  :mod:`~dpnotebook.privacy.distributed_launch`: DP-SGD on several processes (``DPDDP``);
* schedulers of sigma and C between epochs (:class:`StepNoise`, :class:`ExponentialGradClip`, ...);
* :func:`fit`, :func:`train_epoch`, :func:`evaluate`: train and evaluate loops.

>>> from dpnotebook.privacy import PrivacyEngine
>>> PrivacyEngine(accountant="rdp")
PrivacyEngine(accountant='rdp', steps=0, secure_mode=False)
"""

from dpnotebook.privacy._data import (
    AugmultCollate,
    BatchMemoryManager,
    DPDataLoader,
    PoissonBatchSampler,
    augmult_data_loader,
    split_batch,
)
from dpnotebook.privacy._engine import PrivacyEngine
from dpnotebook.privacy._optimizer import (
    DPLossFastGradientClipping,
    DPOptimizer,
    DPTensorFastGradientClipping,
    GhostDPOptimizer,
    unwrap_model,
)
from dpnotebook.privacy._schedulers import (
    ExponentialGradClip,
    ExponentialNoise,
    LambdaGradClip,
    LambdaNoise,
    StepGradClip,
    StepNoise,
)
from dpnotebook.privacy._training import evaluate, fit, train_epoch
from dpnotebook.privacy.accounting import (
    ACCOUNTANTS,
    Accountant,
    PLDAccountant,
    RDPAccountant,
    available_accountants,
    compute_epsilon,
    create_accountant,
)
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
from dpnotebook.privacy.distributed_sampler import DistributedDPDataLoader  # from_data_loader(distributed=True)
from dpnotebook.privacy.noise import gaussian_noise
from dpnotebook.privacy.step_stats import StepStats

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
    "GhostDPOptimizer",
    "DPLossFastGradientClipping",
    "DPTensorFastGradientClipping",
    "StepStats",
    # schedulers of sigma and C
    "ExponentialNoise",
    "StepNoise",
    "LambdaNoise",
    "ExponentialGradClip",
    "StepGradClip",
    "LambdaGradClip",
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
