"""Exceptions raised by dpnotebook.

Each one subclasses the standard exception a user would catch anyway
(``ValueError`` for a bad argument or model, ``RuntimeError`` for something that
went wrong while computing), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

__all__ = ["UnsupportedModuleError", "GradSampleError", "GradSamplerMismatch"]


class UnsupportedModuleError(ValueError):
    """The model holds layers that per-sample gradients cannot be computed for.

    Attributes:
        problems: one :class:`dpnotebook.validation.Problem` per offending submodule.
    """

    def __init__(self, message: str, problems: list | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


class GradSampleError(RuntimeError):
    """Per-sample gradients could not be computed or stored correctly."""


class GradSamplerMismatch(AssertionError):
    """A grad sampler disagrees with the microbatching oracle.

    Attributes:
        report: the :class:`dpnotebook.testing.GradSamplerReport` with every parameter's error.
    """

    def __init__(self, message: str, report: object) -> None:
        super().__init__(message)
        self.report = report
