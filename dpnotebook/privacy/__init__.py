"""DP-SGD in PyTorch: clipping, noise, Poisson sampling, privacy accounting and ``make_private``.

One concept per module (all private; this package is the face):

* ``_mechanisms``: per-sample clipping, Gaussian noise (seedable or secure) and the textbook
  mechanisms (randomized response, Laplace, Gaussian, subsampling, the Gaussian's RDP);
* ``_step``: what a DP step must satisfy (its invariants) and :class:`StepStats`, what it did;
* ``_accounting``: epsilon from Google's ``dp_accounting``, the noise multiplier a budget allows,
  the steps a run takes;
* ``optimizer``: :class:`DPOptimizer` (clip, sum, noise, scale, step);
* ``data_loader``, ``augmult``, ``batch_memory``: Poisson sampling, augmentation multiplicity,
  Opacus' :class:`BatchMemoryManager`;
* ``engine``: :class:`PrivacyEngine` and ``make_private``; ``training``: train and evaluate loops;
* ``_distributed``, ``_launch``: DP-SGD on several processes (:class:`DPDDP`);
* ``_sweep``: privacy-utility sweeps of small runs;
* ``arguments``: the checks behind every error message.

>>> from dpnotebook.privacy import PrivacyEngine
>>> PrivacyEngine(accountant="rdp")
PrivacyEngine(accountant='rdp', steps=0, secure_mode=False)
"""

from dpnotebook.privacy._accounting import (
    ACCOUNTANTS,
    Accountant,
    PLDAccountant,
    RDPAccountant,
    available_accountants,
    classic_rdp_epsilon,
    compute_epsilon,
    create_accountant,
    get_noise_multiplier,
    steps_for_epochs,
    steps_per_epoch,
    subsampled_gaussian_rdp,
)
from dpnotebook.privacy._distributed import (
    DPDDP,
    DifferentiallyPrivateDistributedDataParallel,
    DistributedDPDataLoader,  # from_data_loader(distributed=True)
    DistributedDPOptimizer,
    DistributedGhostDPOptimizer,
    DistributedPoissonBatchSampler,
    RanksFailedError,
)
from dpnotebook.privacy._launch import RankOutcome, run_on_ranks
from dpnotebook.privacy._mechanisms import (
    CLIPPING_MODES,
    ClipResult,
    amplified_by_subsampling,
    clip_and_sum,
    clip_factors,
    gaussian_mechanism,
    gaussian_noise,
    gaussian_rdp,
    laplace_mechanism,
    layer_thresholds,
    per_layer_norms,
    per_sample_norms,
    randomized_response,
)
from dpnotebook.privacy._step import StepStats
from dpnotebook.privacy._sweep import RunResult, RunSetting, Summary, noise_on_average, summarise, sweep, train_run
from dpnotebook.privacy.augmult import AugmultCollate, augmult_data_loader
from dpnotebook.privacy.batch_memory import BatchMemoryManager
from dpnotebook.privacy.data_loader import DPDataLoader, PoissonBatchSampler, split_batch
from dpnotebook.privacy.engine import PrivacyEngine, unwrap_model
from dpnotebook.privacy.optimizer import DPOptimizer
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
    # noise and the textbook mechanisms
    "gaussian_noise",
    "amplified_by_subsampling",
    "gaussian_mechanism",
    "gaussian_rdp",
    "laplace_mechanism",
    "randomized_response",
    # optimizer
    "DPOptimizer",
    "StepStats",
    # data
    "AugmultCollate",
    "BatchMemoryManager",
    "DPDataLoader",
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
    "steps_for_epochs",
    "steps_per_epoch",
    "classic_rdp_epsilon",
    "subsampled_gaussian_rdp",
    # engine and loops
    "PrivacyEngine",
    "unwrap_model",
    "evaluate",
    "fit",
    "train_epoch",
    # distributed
    "DPDDP",
    "DifferentiallyPrivateDistributedDataParallel",
    "DistributedDPDataLoader",
    "DistributedDPOptimizer",
    "DistributedGhostDPOptimizer",
    "DistributedPoissonBatchSampler",
    "RanksFailedError",
    "RankOutcome",
    "run_on_ranks",
    # sweeps
    "RunResult",
    "RunSetting",
    "Summary",
    "noise_on_average",
    "summarise",
    "sweep",
    "train_run",
]
