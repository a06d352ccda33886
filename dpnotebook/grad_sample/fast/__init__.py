"""The fast seam: what the built-in samplers do for speed, kept apart from their formulas.

Each sampler in :mod:`dpnotebook.grad_sample.samplers` states its per-sample gradient as a
formula a student can read (its *reference form*); where a faster way to the same
numbers pays, the sampler calls it through this package, and the tests check the
fast form against the reference form and the float64 oracle.

* :mod:`~dpnotebook.grad_sample.fast.buffers`: result buffers reused from step to
  step when nothing else holds them (the only place that looks at reference counts);
* :mod:`~dpnotebook.grad_sample.fast.linear`: the linear weight gradient as one
  batched product into such a buffer;
* :mod:`~dpnotebook.grad_sample.fast.conv`: convolution weight gradients by im2col, a
  grouped call or ``vmap``, in chunks of samples.
* :mod:`~dpnotebook.grad_sample.fast.device`: which of these choices a device gets: the
  rules measured on a CPU decide only CPU runs; a GPU gets its own (unmeasured) rule.
"""
