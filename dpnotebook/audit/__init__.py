"""Auditing what DP training promises, from the inside and from the outside.

Inside: :func:`audit_sensitivity` measures how far one sample moves a DP-SGD step (at most ``C``),
on adversarial layer families and records (:func:`grid`, ``python -m dpnotebook.audit``) and
training-loop surfaces. Outside: DP as a hypothesis test, membership attacks, and empirical lower
bounds on epsilon from canaries in one training run (:func:`audit_one_run`, :class:`GradientCanaries`).

>>> from dpnotebook.audit import advantage_bound, gaussian_epsilon
>>> round(advantage_bound(gaussian_epsilon(1.0, 1e-5), 1e-5), 3)    # mu = 1: what any attacker gains at most
0.975
"""

from dpnotebook.audit._attacks import (
    AttackROC,
    OneRunAudit,
    OperatingPoint,
    advantage_bound,
    advantage_noise_floor,
    attack_roc,
    audit_one_run,
    calibrated_attack,
    clopper_pearson,
    default_guesses,
    dp_tpr_bound,
    example_losses,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu,
    gaussian_tpr,
    held_out_point,
    loss_threshold_attack,
    one_run_epsilon,
    one_run_p_value,
    pld_tpr,
    sliced_attack,
    worst_case_correct,
)
from dpnotebook.audit._canaries import (
    AuditedRun,
    GradientCanaries,
    audited_digits_run,
    dp_sgd_canary_scores,
    draw_inclusion,
    gaussian_mechanism_scores,
    mislabeled_canaries,
    random_image_canaries,
    unreached_coordinates,
)
from dpnotebook.audit._cases import (
    FAMILIES,
    RECORDS,
    SURFACES,
    AuditCase,
    Family,
    RelativeBias,
    Surface,
    audit_case,
    audit_surface,
    surface_matches,
)
from dpnotebook.audit._grid import GridPoint, Outcome, grid, matches, run_point, summarise
from dpnotebook.audit._sensitivity import (
    FLOAT32_TOLERANCE,
    TOLERANCE,
    SensitivityReport,
    audit_sensitivity,
    audit_sensitivity_across_ranks,
    clipped_sum,
    reference_clipped_sum,
)

__all__ = [
    # the sensitivity auditor and what it runs on
    "audit_sensitivity",
    "audit_sensitivity_across_ranks",
    "SensitivityReport",
    "clipped_sum",
    "reference_clipped_sum",
    "TOLERANCE",
    "FLOAT32_TOLERANCE",
    "Family",
    "FAMILIES",
    "RelativeBias",
    "RECORDS",
    "AuditCase",
    "audit_case",
    "Surface",
    "SURFACES",
    "audit_surface",
    "surface_matches",
    "GridPoint",
    "Outcome",
    "grid",
    "run_point",
    "matches",
    "summarise",
    # DP as a hypothesis test, membership attacks, one-run audits
    "gaussian_mu",
    "gaussian_tpr",
    "gaussian_delta",
    "gaussian_epsilon",
    "dp_tpr_bound",
    "pld_tpr",
    "AttackROC",
    "attack_roc",
    "advantage_bound",
    "clopper_pearson",
    "advantage_noise_floor",
    "OperatingPoint",
    "held_out_point",
    "example_losses",
    "loss_threshold_attack",
    "calibrated_attack",
    "sliced_attack",
    "one_run_p_value",
    "one_run_epsilon",
    "OneRunAudit",
    "audit_one_run",
    "default_guesses",
    "worst_case_correct",
    # canaries
    "draw_inclusion",
    "random_image_canaries",
    "mislabeled_canaries",
    "gaussian_mechanism_scores",
    "dp_sgd_canary_scores",
    "GradientCanaries",
    "unreached_coordinates",
    "AuditedRun",
    "audited_digits_run",
]
