"""``opacus.utils`` under dpnotebook: ``batch_memory_manager``, ``per_sample_gradients_utils``,
``fast_gradient_clipping_utils``."""
