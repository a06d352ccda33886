"""The built-in per-layer samplers: each layer family's formula, with its norm sampler beside it.

A *grad sampler* (``linear.py``, ``conv.py``, ``norms.py``, ...) states a layer's
per-sample gradient, averaged over each sample's ``K`` copies, as the formula that
runs; where a faster route to the same numbers pays, it is attached at registration
(``register_grad_sampler(..., fast=...)``: linear, conv, embedding). A *norm sampler*
(``linear_norm.py``, ``rnn_norm.py``, ``materialised_norm.py``) gives ghost mode the same gradients'
norms and their weighted sum, often without forming them. Shared row helpers are
in :mod:`~dpnotebook.grad_sample._contracts`.

Importing this package registers every built-in grad sampler; ghost mode imports
the norm samplers when it is first used.
"""

from dpnotebook.grad_sample.samplers import (  # noqa: F401  (importing fills the registry)
    attention,
    conv,
    embedding,
    embedding_bag,
    gate_projection,
    linear,
    lora,
    norms,
)
