"""The machinery every grad-sample mode shares, and one module per mode.

* the modes: ``hooks`` (:class:`~dpnotebook.grad_sample.GradSampleModule`, which the others build on;
  also which layers become units and the checks of ``K`` and ``loss_reduction``), ``functorch``,
  ``ew`` (PyTorch's ExpandedWeights) and ``no_op`` (with the base of the wrappers without hooks);
* ``layer_hooks``: recording layer calls in the forward pass, running their samplers in the
  backward pass, and refusing a parameter used outside its layer;
* ``calls``: a recorded layer call, where its rows are, and its replay with ``torch.func``;
* ``accumulation``: the store of ``p.grad_sample`` and the check that no row went missing;
* ``precision``: the mixed-precision contract;
* the refusals that keep rows right: ``provenance`` (the one-time proof that every layer's rows are
  the samples) and ``broadcast`` (where a batch-free tensor meets the batch).
"""
