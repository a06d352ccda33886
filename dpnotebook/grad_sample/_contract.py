"""Old import path of :mod:`dpnotebook.grad_sample.sample_rows`, kept for one release."""

from dpnotebook.grad_sample.sample_rows import affine_grads, flat_rows, group_rows, sum_rows  # noqa: F401
