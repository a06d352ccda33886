"""The architecture facts ``docs/real-models.md`` and ``tiny_transformer``'s docstring state of the zoo's
Hugging Face models, read from the built models (``transformers`` 5.24's classes and config defaults)."""

from __future__ import annotations

from collections import Counter

import pytest
from torch import nn

from dpnotebook.benchmarks.zoo import build, hf_case

pytest.importorskip("transformers")


def counts(model: nn.Module) -> Counter[str]:
    return Counter(type(m).__name__ for m in model.modules())


def test_llama_groups_its_key_value_heads() -> None:
    attention = build("llama").model.model.model.layers[0].self_attn
    config = attention.config
    assert (config.num_attention_heads, config.num_key_value_heads) == (2, 1)  # the zoo: 1 for its 2 query heads
    assert attention.k_proj.out_features == attention.q_proj.out_features // 2
    assert counts(build("llama").model)["LlamaRMSNorm"] == 3  # two per block, one final
    preset = hf_case("llama", width=128, layers=2, heads=4)[0]().model.config  # the --transformers preset
    assert (preset.num_attention_heads, preset.num_key_value_heads) == (4, 2)


def test_t5_has_8_relative_buckets_7_rms_norms_and_tied_embeddings() -> None:
    t5 = build("t5").model.model
    assert t5.config.relative_attention_num_buckets == 8
    assert counts(t5)["T5LayerNorm"] == 7  # encoder 2 + final, decoder 3 + final
    assert t5.get_output_embeddings().weight is t5.get_input_embeddings().weight


def test_gpt2_has_four_conv1d_per_block_a_4x_feed_forward_and_tied_embeddings() -> None:
    gpt2 = build("gpt2").model.model
    assert counts(gpt2)["Conv1D"] == 4 * gpt2.config.n_layer
    width = gpt2.config.n_embd
    assert gpt2.transformer.h[0].mlp.c_fc.weight.shape == (width, 4 * width)  # Conv1D stores [in, out]
    assert gpt2.get_output_embeddings().weight is gpt2.get_input_embeddings().weight


def test_the_others_have_a_2x_feed_forward() -> None:
    width = 16
    assert build("bert").model.model.config.intermediate_size == 2 * width
    assert build("distilbert").model.model.config.hidden_dim == 2 * width
    assert build("t5").model.model.config.d_ff == 2 * width
    assert build("llama").model.model.config.intermediate_size == 2 * width
