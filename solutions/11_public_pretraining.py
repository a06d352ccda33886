# Solutions to tutorial 11. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 11.lora_sampler
def my_lora_sampler(layer, activations, backprops, K):
    x = activations[0]
    rows, d_in, d_out = x.shape[0], x.shape[-1], backprops.shape[-1]
    x = x.reshape(rows // K, -1, d_in)               # [B, K * positions, in]: a sample's rows and positions
    g = backprops.reshape(rows // K, -1, d_out)      # [B, K * positions, out]
    u = x @ layer.lora_A.T                           # u_t = A x_t: [B, n, r]
    pulled = g @ layer.lora_B                        # B^T g_t:     [B, n, r]
    s = layer.scale
    return {
        layer.lora_B: s * torch.einsum("bno,bnr->bor", g, u) / K,      # s * sum_t g_t u_t^T, mean over K
        layer.lora_A: s * torch.einsum("bnr,bni->bri", pulled, x) / K,  # s * sum_t (B^T g_t) x_t^T
    }
