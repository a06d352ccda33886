"""Ghost mode: per-sample gradient norms and the clipped sum, without per-sample gradients.

* :mod:`~dpnotebook.grad_sample.ghost._wrapper`: ``GhostGradSampleModule``, which
  records each ghosted layer's calls (and refuses stale records);
* :mod:`~dpnotebook.grad_sample.ghost._ledger`: a batch's records and what they add up to;

The norm samplers it uses sit beside the grad samplers in
:mod:`dpnotebook.grad_sample.samplers`, their protocol and registry in
:mod:`dpnotebook.grad_sample._contracts`. Public names come from
:mod:`dpnotebook.grad_sample`.
"""
