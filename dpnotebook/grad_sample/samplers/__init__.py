"""The built-in per-layer samplers: each layer family's formula, with its norm sampler beside it.

A *grad sampler* (``linear.py``, ``conv.py``, ...) turns a layer's activations and
backprops into each sample's gradient, averaged over its ``K`` copies; it is
registered for hooks mode (and the others that build on it). A *norm sampler*
(``linear_norm.py``, ``rnn_norm.py``, ``materialised_norm.py``) gives ghost mode the same gradients'
norms and their weighted sum, often without forming them. Shared row helpers are
in :mod:`~dpnotebook.grad_sample._contracts`; the speed tricks the grad
samplers call are behind :mod:`dpnotebook.grad_sample.fast`.

Importing this package registers every built-in grad sampler; ghost mode imports
the norm samplers when it is first used.
"""

from dpnotebook.grad_sample.samplers import (  # noqa: F401  (importing fills the registry)
    attention,
    conv,
    embedding,
    embedding_bag,
    gate_projection,
    group_norm,
    instance_norm,
    layer_norm,
    linear,
    lora,
    rms_norm,
)
