"""DP-SGD in PyTorch: clipping, noise, Poisson sampling, privacy accounting and ``make_private``.

The modules are private, one concept each (accounting, mechanisms, the step, the optimizer, data loading,
the engine, schedulers, training loops, sweeps, distributed training); this package is their face.

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
from dpnotebook.privacy._data import (
    AugmultCollate,
    BatchMemoryManager,
    DPDataLoader,
    PoissonBatchSampler,
    augmult_data_loader,
    split_batch,
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
from dpnotebook.privacy._engine import PrivacyEngine
from dpnotebook.privacy._graphed import GraphedStep, row_cross_entropy
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
from dpnotebook.privacy._step import StepStats
from dpnotebook.privacy._sweep import RunResult, RunSetting, Summary, noise_on_average, summarise, sweep, train_run
from dpnotebook.privacy._training import evaluate, fit, train_epoch

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
    "GhostDPOptimizer",
    "DPLossFastGradientClipping",
    "DPTensorFastGradientClipping",
    "StepStats",
    # a step a CUDA graph replays
    "GraphedStep",
    "row_cross_entropy",
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
