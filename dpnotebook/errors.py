"""Exceptions raised by dpnotebook, each a subclass of the standard exception a user would catch anyway
(``ValueError`` for a bad argument or model, ``RuntimeError`` for a failed computation)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "UnsupportedModuleError",
    "UnsupportedOptionError",
    "GradSampleError",
    "GradSamplerMismatch",
    "PrivacyWarning",
]


class UnsupportedModuleError(ValueError, NotImplementedError):
    """The model holds layers that per-sample gradients cannot be computed for (a ``ValueError``, and the
    ``NotImplementedError`` Opacus' ``GradSampleModule`` raises for them).

    >>> from torch import nn
    >>> from dpnotebook import GradSampleModule, UnsupportedModuleError
    >>> try:
    ...     GradSampleModule(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    ... except UnsupportedModuleError as err:
    ...     print(err.problems[0].path, err.problems[0].module_type)
    model.1 BatchNorm1d

    Attributes:
        problems: one :class:`dpnotebook.validation.Problem` per offending submodule.
    """

    def __init__(self, message: str, problems: list[Any] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


class UnsupportedOptionError(ValueError, NotImplementedError):
    """An option that Opacus has and dpnotebook refuses by design; the message says why and what to use.
    A ``ValueError`` (a bad argument) and the ``NotImplementedError`` Opacus raises for what it does not do.

    >>> from dpnotebook import PrivacyEngine
    >>> try:
    ...     PrivacyEngine(accountant="gdp")
    ... except NotImplementedError as err:
    ...     print(str(err).split(":")[0])
    accountant='gdp' is not supported
    """


class GradSampleError(RuntimeError):
    """Per-sample gradients could not be computed or stored correctly.

    >>> import torch
    >>> from torch import nn
    >>> from dpnotebook import GradSampleModule, GradSampleError
    >>> model = GradSampleModule(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)), batch_first=False)
    >>> try:
    ...     model(torch.randn(5, 3))      # batch-first data, but batch_first=False was said
    ... except GradSampleError as err:
    ...     print(str(err).split(":")[0])
    model.0 (Linear) sees 4 rows in dim 1 but the model's input carries 3 rows in dim 1 (batch_first=False, K=1)
    """


class GradSamplerMismatch(AssertionError):
    """A grad sampler disagrees with the microbatching oracle.

    >>> import torch
    >>> from torch import nn
    >>> from dpnotebook import GradSamplerMismatch, register_grad_sampler
    >>> from dpnotebook.grad_sample import unregister_grad_sampler
    >>> from dpnotebook.testing import check_grad_sampler
    >>> class Double(nn.Linear):
    ...     pass
    >>> @register_grad_sampler(Double)
    ... def wrong(layer, activations, backprops, K):   # the bias part forgets to divide by K
    ...     g, a = backprops.reshape(-1, K, 2), activations[0].reshape(-1, K, 2)
    ...     return {layer.weight: torch.einsum("bko,bki->boi", g, a) / K, layer.bias: g.sum(1)}
    >>> try:
    ...     check_grad_sampler(Double(2, 2), torch.randn(6, 2), K=3)
    ... except GradSamplerMismatch as err:
    ...     print(sorted({row.name for row in err.report.rows if not row.ok}))
    ['bias']
    >>> unregister_grad_sampler(Double)

    Attributes:
        report: the :class:`dpnotebook.testing.GradSamplerReport` with every parameter's error.
    """

    def __init__(self, message: str, report: object) -> None:
        super().__init__(message)
        self.report = report


class PrivacyWarning(UserWarning):
    """The privacy guarantee, or the epsilon reported, may not hold as stated: a warning where the choice is
    the user's (shuffled batches instead of Poisson sampling, noise that is not cryptographically secure);
    the message says what it costs and how to do otherwise."""
