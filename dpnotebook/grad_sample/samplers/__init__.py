"""The built-in per-layer samplers: each layer family's formula, with its norm sampler beside it.

A *grad sampler* (``linear.py``, ``conv.py``, ...) states a layer's per-sample gradient,
averaged over each sample's ``K`` copies, as the formula that runs; a faster route to the same
numbers may be attached (``register_grad_sampler(..., fast=...)``). A *norm sampler*
(``linear_norm.py``, ``rnn_norm.py``, ``materialised_norm.py``) gives ghost mode their norms and
weighted sum, often without forming them. Their contracts are in ``_contracts.py``. Importing
this package registers every built-in grad sampler; ghost mode imports the norm samplers.
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
