"""Model shapes for ``flashsplit models``: transformers configs built in code (no download) at the
real widths of five open models, with random weights and a few layers.

Each entry gives the transformers class and config fields; ``tiny`` scales the widths down so the
whole grid runs on a CPU through the Triton interpreter (a smoke run). The reference attention is
SDPA; for softcap (Gemma 2) and sink (gpt-oss) layers, which SDPA does not have, the model's
eager attention and transformers' FlexAttention.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelShape:
    """One model: its transformers class and config, and its reference attention."""

    name: str
    model_class: str  #: e.g. "LlamaForCausalLM"
    config_class: str  #: e.g. "LlamaConfig"
    fields: dict = field(default_factory=dict)  #: config fields at the real widths
    #: transformers' attention implementations flashsplit is compared with, the first leading.
    references: tuple[str, ...] = ("sdpa",)

    def config(self, layers: int, max_positions: int, tiny: bool = False):
        """The transformers config with ``layers`` layers, positions for ``max_positions`` tokens."""
        import transformers

        positions = max(self.fields.get("max_position_embeddings", 0), max_positions)
        fields = dict(self.fields, num_hidden_layers=layers, max_position_embeddings=positions, initializer_range=0.05)
        if tiny:
            fields.update(_TINY)
            if "head_dim" in self.fields and self.fields["head_dim"] == 256:
                fields["head_dim"] = fields["query_pre_attn_scalar"] = 128
            if "sliding_window" in self.fields:
                fields["sliding_window"] = 16
        fields.pop("layer_types", None)  # recomputed from the layer count
        return getattr(transformers, self.config_class)(**fields)

    def kv_bytes_per_token(self, config, element_size: int) -> int:
        """Cache bytes per token of one row (keys and values, every layer; a sliding layer's cache
        is counted whole, as a full StaticCache would hold it)."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * element_size


#: A softcap or sinks: SDPA has neither; eager attention builds [B, H, L, L] scores (out of memory
#: at long prompts), transformers' FlexAttention runs both in O(L) memory.
_SOFTCAP_OR_SINKS = ("eager", "flex_attention")

#: Widths for a CPU smoke run: small heads and hidden sizes, the same features.
_TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
             head_dim=64)

MODELS = {shape.name: shape for shape in [
    ModelShape("llama3-8b", "LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, rope_theta=500000.0)),
    ModelShape("qwen2.5-7b", "Qwen2ForCausalLM", "Qwen2Config", dict(  # GQA 7
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
        head_dim=128, rope_theta=1000000.0)),
    ModelShape("mistral-7b", "MistralForCausalLM", "MistralConfig", dict(  # a 4096-key window on every layer
        vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, sliding_window=4096)),
    ModelShape("gemma2-9b", "Gemma2ForCausalLM", "Gemma2Config", dict(  # softcap; sliding and full layers alternate
        vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_attention_heads=16, num_key_value_heads=8,
        head_dim=256, sliding_window=4096, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0), references=_SOFTCAP_OR_SINKS),
    ModelShape("gpt-oss-20b", "GptOssForCausalLM", "GptOssConfig", dict(  # sinks, 128-key windows, MoE (8 experts)
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_attention_heads=64, num_key_value_heads=8,
        head_dim=64, sliding_window=128, num_local_experts=8, num_experts_per_tok=4,
        max_position_embeddings=131072), references=_SOFTCAP_OR_SINKS),  # YaRN scaling for 128k positions
]}
