"""``opacus.grad_sample.utils`` under dpnotebook (:mod:`dpnotebook._opacus.utils`)."""

from dpnotebook._opacus.utils import get_gsm_class, register_grad_sampler, wrap_model

__all__ = ["wrap_model", "get_gsm_class", "register_grad_sampler"]
