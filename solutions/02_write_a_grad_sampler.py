# Solutions to tutorial 02. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 02.linear_einsum
def linear_sampler(layer, activations, backprops, K):
    a = activations[0]                  # [B*K, ..., in_features]
    g = backprops                       # [B*K, ..., out_features]
    B = a.shape[0] // K
    a = a.reshape(B, -1, a.shape[-1])   # [B, K*T, in]: the K copies and the positions, one sum
    g = g.reshape(B, -1, g.shape[-1])   # [B, K*T, out]
    return {
        layer.weight: torch.einsum("bno,bni->boi", g, a) / K,
        layer.bias: g.sum(1) / K,
    }

# %% exercise 02.gate_sampler
@register_grad_sampler(Gate)
def gate_sampler(layer, activations, backprops, K):
    x = activations[0]                  # [B*K, ..., features]
    B, f = x.shape[0] // K, x.shape[-1]
    s = torch.sigmoid(layer.w)
    through = (backprops * x).reshape(B, -1, f).sum(1) / K    # d loss / d sigmoid(w), per sample
    return {layer.w: through * s * (1 - s)}                   # chain rule: sigmoid' = s (1 - s)

# %% exercise 02.lora_sampler
@register_grad_sampler(LoRALinear)
def lora_sampler(layer, activations, backprops, K):
    a = activations[0]                  # [B*K, ..., in_features]
    g = backprops                       # [B*K, ..., out_features]
    B = a.shape[0] // K
    a = a.reshape(B, -1, a.shape[-1])   # [B, K*T, in]
    g = g.reshape(B, -1, g.shape[-1])   # [B, K*T, out]
    h = a @ layer.A.T                   # [B, K*T, rank]: what B sees
    g_hidden = g @ layer.B              # [B, K*T, rank]: B^T g, what comes back to A
    return {
        layer.B: torch.einsum("bno,bnr->bor", g, h) / K,
        layer.A: torch.einsum("bnr,bni->bri", g_hidden, a) / K,
    }
