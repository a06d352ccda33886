"""The machinery every mode shares: wrappers, hooks, the store, layer calls.

* :mod:`~dpnotebook.grad_sample.engine.module`:
  :class:`~dpnotebook.grad_sample.engine.module.GradSampleModule`, the hooks-mode
  wrapper the other modes build on; :mod:`~dpnotebook.grad_sample.engine.units`
  decides which layers it samples, :mod:`~dpnotebook.grad_sample.engine.wrap_arguments`
  checks ``K`` and ``loss_reduction``;
* :mod:`~dpnotebook.grad_sample.engine.hooks`: recording layer calls in the forward
  pass, running their samplers in the backward pass;
  :mod:`~dpnotebook.grad_sample.engine.accumulation`: the store of ``p.grad_sample``
  and the check that no row went missing;
* :mod:`~dpnotebook.grad_sample.engine.registry`: the registry of per-layer grad
  samplers (:mod:`dpnotebook.grad_sample.samplers` fills it);
* :mod:`~dpnotebook.grad_sample.engine.functorch_fallback`: a layer call replayed
  with ``torch.func`` (the fallback of layers without a sampler, and functorch mode);
* :mod:`~dpnotebook.grad_sample.engine.precision`: the mixed-precision contract (recorded
  activations and backprops read in float32, per-sample work with autocast off);
* the modes ``"ew"`` (:mod:`~dpnotebook.grad_sample.engine.expanded_weights`) and
  Opacus' ``"no_op"`` (:mod:`~dpnotebook.grad_sample.engine.gsm_no_op`), both
  :class:`~dpnotebook.grad_sample.engine.outer_wrapper.OuterWrapper` classes;
* the refusals that keep rows right: :mod:`~dpnotebook.grad_sample.engine.provenance`
  (the one-time proof that every layer's rows are the samples),
  :mod:`~dpnotebook.grad_sample.engine.batch_rows`,
  :mod:`~dpnotebook.grad_sample.engine.output_batch_dim`,
  :mod:`~dpnotebook.grad_sample.engine.outside_use`,
  :mod:`~dpnotebook.grad_sample.engine.ownership`,
  :mod:`~dpnotebook.grad_sample.engine.packed`.
"""
