"""Auditing what DP training promises.

* :mod:`~dpnotebook.audit.sensitivity`: :func:`audit_sensitivity` measures how far one
  sample moves a DP-SGD step (it must be at most ``C``), with the library's own step;
* :mod:`~dpnotebook.audit.families` and :mod:`~dpnotebook.audit.records`: small models and adversarial
  records to audit it on;
* :mod:`~dpnotebook.audit.grid`: every mode x family x record x K x reduction x layout x clipping, with
  the refusals the library makes by design; ``python -m dpnotebook.audit`` runs it.
"""

from dpnotebook.audit.sensitivity import TOLERANCE, SensitivityReport, audit_sensitivity, clipped_sum

__all__ = ["audit_sensitivity", "SensitivityReport", "clipped_sum", "TOLERANCE"]
