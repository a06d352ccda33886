# Solutions to tutorial 09. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 09.per_layer_privatize
def privatize_per_layer(grads, *, C, sigma, expected_batch_size, generator):
    layer_bound = C / len(grads) ** 0.5          # L layers of norm <= C / sqrt(L): total norm <= C
    noisy = []
    for g in grads:                               # g: [B, *shape], one parameter
        norms = g.flatten(1).norm(dim=1)          # this layer's norm, per sample
        factor = (layer_bound / (norms + 1e-6)).clamp(max=1.0)
        clipped_sum = torch.tensordot(factor, g, dims=1)
        noise = torch.normal(0.0, sigma * C, clipped_sum.shape, generator=generator, dtype=clipped_sum.dtype)
        noisy.append((clipped_sum + noise) / expected_batch_size)   # the sensitivity is C, not C / sqrt(L)
    return noisy
