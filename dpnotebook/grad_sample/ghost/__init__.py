"""Ghost mode: per-sample gradient norms and the clipped sum, without per-sample gradients.

``_wrapper.py`` holds ``GhostGradSampleModule``, which records each ghosted layer's calls;
``_ledger.py`` a batch's records and what they add up to. Public names come from
:mod:`dpnotebook.grad_sample`.
"""
