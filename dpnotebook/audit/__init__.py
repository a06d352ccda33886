"""Auditing what DP training promises.

* :mod:`~dpnotebook.audit.sensitivity`: :func:`audit_sensitivity` measures how far one
  sample moves a DP-SGD step (it must be at most ``C``), with the library's own step;
* :mod:`~dpnotebook.audit.families` and :mod:`~dpnotebook.audit.records`: small models and adversarial
  records to audit it on;
* :mod:`~dpnotebook.audit.grid`: every mode x family x record x K x reduction x layout x clipping, with
  the refusals the library makes by design; ``python -m dpnotebook.audit`` runs it.

What the guarantee buys, measured from the outside:

* :mod:`~dpnotebook.audit.tradeoff`: DP as a hypothesis test (Gaussian and DP-SGD trade-off curves,
  the bound ``TPR <= e^eps FPR + delta``);
* :mod:`~dpnotebook.audit.roc` and :mod:`~dpnotebook.audit.membership`: membership-inference attacks
  on a trained model (loss threshold, calibrated by reference models), ROC, advantage;
* :mod:`~dpnotebook.audit.canaries` and :mod:`~dpnotebook.audit.one_run`: an empirical lower bound on
  epsilon from canaries in one training run (Steinke, Nasr & Jagielski 2023);
* :mod:`~dpnotebook.audit.gradient_canaries`: white-box canaries whose per-sample gradients the auditor
  crafts (Nasr et al. 2023), scored on the released noisy gradients;
* :mod:`~dpnotebook.audit.experiment`: both on a digits model, next to the accountant's epsilon.
"""

from dpnotebook.audit.canaries import draw_inclusion, gaussian_mechanism_scores
from dpnotebook.audit.experiment import AuditedRun, audited_digits_run
from dpnotebook.audit.gradient_canaries import GradientCanaries
from dpnotebook.audit.membership import calibrated_attack, example_losses, loss_threshold_attack, sliced_attack
from dpnotebook.audit.one_run import OneRunAudit, audit_one_run
from dpnotebook.audit.roc import (
    AttackROC,
    OperatingPoint,
    advantage_bound,
    advantage_noise_floor,
    attack_roc,
    clopper_pearson,
    held_out_point,
)
from dpnotebook.audit.sensitivity import TOLERANCE, SensitivityReport, audit_sensitivity, clipped_sum
from dpnotebook.audit.tradeoff import dp_tpr_bound, gaussian_epsilon, gaussian_tpr, pld_tpr

__all__ = [
    "audit_sensitivity",
    "SensitivityReport",
    "clipped_sum",
    "TOLERANCE",
    "attack_roc",
    "AttackROC",
    "advantage_bound",
    "example_losses",
    "loss_threshold_attack",
    "calibrated_attack",
    "sliced_attack",
    "clopper_pearson",
    "held_out_point",
    "OperatingPoint",
    "advantage_noise_floor",
    "draw_inclusion",
    "gaussian_mechanism_scores",
    "audit_one_run",
    "OneRunAudit",
    "GradientCanaries",
    "gaussian_tpr",
    "gaussian_epsilon",
    "dp_tpr_bound",
    "pld_tpr",
    "audited_digits_run",
    "AuditedRun",
]
