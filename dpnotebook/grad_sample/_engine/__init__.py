"""The machinery every grad-sample mode shares, and one module per mode.

Modes: ``hooks`` (which the others build on), ``functorch``, ``ew`` and ``no_op``. Shared:
``layer_hooks`` (record calls, run samplers), ``calls`` (a recorded call and its ``torch.func``
replay), ``accumulation`` (the store of ``p.grad_sample``), ``precision``, and the refusals that
keep rows right: ``provenance`` and ``broadcast``.
"""
