# Solutions to tutorial 01. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 01.per_sample_norms
C = 2.7
norms = torch.cat([g.flatten(1) for g in oracle.values()], dim=1).norm(dim=1)   # all parameters in one vector
factors = (C / norms).clamp(max=1.0)                                           # shrink only, never stretch
print("norms:", [round(n, 2) for n in norms.tolist()], "| clipped:", int((factors < 1).sum()), "of 8")

# %% exercise 01.norm_without_materialising
def linear_weight_norms(a, g):
    """Per-sample norms of the weight gradients sum_t g_t a_t^T, shape [B]."""
    if a.dim() == 2:                                    # one position: ||g a^T|| = ||g|| ||a||
        return g.norm(dim=1) * a.norm(dim=1)
    gram_a = torch.einsum("bti,bsi->bts", a, a)         # [B, T, T]: a_t . a_s
    gram_g = torch.einsum("bto,bso->bts", g, g)         # [B, T, T]: g_t . g_s
    return (gram_a * gram_g).sum(dim=(1, 2)).sqrt()
