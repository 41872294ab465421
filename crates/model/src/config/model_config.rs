//! `ModelConfig`, the validated runtime description a transformer is built from, the types it
//! is made of (activation, MoE, MLA, attention kinds), and the queries derived from it (per-layer
//! sparsity, window and RoPE; the attention scale; whether the model is the plain block).
//!
//! What it is not: parsing or writing config.json (`validate`, `hf_json`) or the family table
//! (`architecture`); every `ModelConfig` that parsing returns has passed `validate`.
//!
//! Invariants: per-layer vectors (`layer_types`, `rope_layers`, `MoeConfig::sparse_layers`) are
//! `num_hidden_layers` long or empty, and the queries answer for layers past them (the MTP
//! modules' blocks); `same_layout` ignores only what does not shape the computation.

use super::architecture::Architecture;
use super::rope::{Rope, RopeScaling};
use serde_json::{Map, Value};

/// The activation of the gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (`silu`).
    Silu,
    /// GeGLU with the tanh approximation (`gelu_pytorch_tanh`, Gemma).
    GeluTanh,
    /// GeGLU with the exact erf form (`gelu`).
    Gelu,
    /// Squared ReLU (`relu2`), gated.
    Relu2,
}

impl Activation {
    /// The name transformers' `ACT2FN` knows it by.
    pub fn hf_name(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
            Activation::Gelu => "gelu",
            Activation::Relu2 => "relu2",
        }
    }

    pub(super) fn from_hf_name(name: &str) -> Option<Activation> {
        match name {
            "silu" | "swish" => Some(Activation::Silu),
            // `gelu_new` is the same tanh formula (transformers' NewGELUActivation).
            "gelu_pytorch_tanh" | "gelu_new" => Some(Activation::GeluTanh),
            "gelu" => Some(Activation::Gelu),
            "relu2" => Some(Activation::Relu2),
            _ => None,
        }
    }
}

/// How a mixture-of-experts checkpoint names its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertNaming {
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.{e}.w1|w3|w2` (gate, up, down).
    Mixtral,
    /// `mlp.gate`, `mlp.experts.{e}.gate_proj|up_proj|down_proj` (Qwen2/3-MoE, OLMoE).
    Qwen,
    /// `mlp.router.gate`, `mlp.experts.{e}.*`, `mlp.shared_experts.*`, `mlp.expert_bias` (AFMoE).
    Afmoe,
    /// `mlp.gate`, `mlp.gate.e_score_correction_bias`, `mlp.experts.{e}.*`,
    /// `mlp.shared_experts.*` (DeepSeek-V3).
    Deepseek,
}

/// How the router turns its logits into the experts' scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RouterScore {
    /// Softmax over the experts; the top-k renormalized with `norm_topk_prob`.
    Softmax,
    /// Independent sigmoids, chosen on `score + expert_bias`; the chosen scores normalized to
    /// sum to 1 (with `norm_topk_prob`) and multiplied by `route_scale` (AFMoE, DeepSeek-V3's
    /// `routed_scaling_factor`).
    Sigmoid { route_scale: f64 },
}

/// DeepSeek-V3's group-limited routing: the experts split into `groups` equal groups, each
/// scored by the sum of its two best `score + bias`; only the `topk_groups` best groups'
/// experts can be chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLimit {
    pub groups: usize,
    pub topk_groups: usize,
}

/// Multi-head latent attention (DeepSeek-V2/V3). Queries: `q_b(norm(q_a(x)))` (or `q_proj(x)`
/// without `q_lora_rank`), per head `qk_nope_head_dim` unrotated plus `qk_rope_head_dim` rotated
/// dims. Keys and values come from one latent per token: `kv_a_proj_with_mqa(x)` gives
/// `kv_lora_rank` latent dims (normed by `kv_a_layernorm`) and one shared rotated key of
/// `qk_rope_head_dim`; `kv_b_proj` expands the latent into each head's unrotated key and
/// `v_head_dim` value. The KV cache holds the latent and the rotated key only.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaConfig {
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// RoPE over interleaved pairs `(x0, x1), (x2, x3), ...` (DeepSeek's layout) instead of
    /// halves.
    pub rope_interleave: bool,
}

impl MlaConfig {
    /// The width of a query or key head: unrotated plus rotated dims.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

/// A sparse mixture-of-experts MLP: a linear router over `num_experts`, softmax, the top
/// `num_experts_per_tok` experts per token (renormalized with `norm_topk_prob`), each a gated
/// MLP of `expert_intermediate_size`; Qwen2-MoE adds a shared expert behind a sigmoid gate.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub expert_intermediate_size: usize,
    pub norm_topk_prob: bool,
    /// Qwen2-MoE's shared expert (its intermediate size), added to every token's output after
    /// `sigmoid(x · shared_expert_gate)`; AFMoE's shared experts (one MLP of
    /// `moe_intermediate_size * num_shared_experts`), added ungated.
    pub shared_expert_intermediate_size: Option<usize>,
    pub router_score: RouterScore,
    /// Per layer: sparse (experts) or dense (`intermediate_size`): `decoder_sparse_step`,
    /// `mlp_only_layers`.
    pub sparse_layers: Vec<bool>,
    /// HF's `router_aux_loss_coef` (the load-balancing loss weight), kept for training.
    pub router_aux_loss_coef: f64,
    pub naming: ExpertNaming,
    /// DeepSeek-V3's group-limited choice (`n_group`, `topk_group`).
    pub group_limit: Option<GroupLimit>,
}

/// What a layer's attention sees (`layer_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Every earlier key (`full_attention`).
    Full,
    /// The last `sliding_window` positions, the query's own included (`sliding_attention`).
    Sliding,
}

impl AttentionKind {
    pub(super) fn hf_name(self) -> &'static str {
        match self {
            AttentionKind::Full => "full_attention",
            AttentionKind::Sliding => "sliding_attention",
        }
    }
}

/// Where a classifier's `score` head reads the hidden states (`ModelConfig::score_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScoreKind {
    /// `*ForSequenceClassification` (a reward model): one score per sequence, at its last token
    /// that is not `pad_token_id` (transformers' rule); the head has no bias.
    #[default]
    Sequence,
    /// `*ForTokenClassification` (a process reward model): a score at every position; the head
    /// has a bias `score.bias` `[labels]` unless the config sets `token_classification_bias` to
    /// false (transformers' `GenericForTokenClassification`).
    Token { bias: bool },
}

/// Validated description of one decoder-only transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope: Rope,
    /// Biases on q_proj, k_proj, v_proj.
    pub attention_bias: bool,
    /// Bias on o_proj (Llama/Qwen3 with `attention_bias: true`; never for Qwen2).
    pub attention_output_bias: bool,
    /// Biases on gate/up/down projections (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// Per-head RMSNorm on queries and keys before RoPE (Qwen3).
    pub qk_norm: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The gated MLP's activation (SwiGLU unless the config says otherwise).
    pub hidden_act: Activation,
    /// Gemma's RMSNorm: the weight is stored as an offset from 1 (`norm(x) * (1 + w)`).
    pub norm_unit_offset: bool,
    /// Sandwich norms (Gemma 2/3): the attention and MLP outputs are normed before the residual
    /// add (`post_attention_layernorm`, `post_feedforward_layernorm`), and the MLP input by
    /// `pre_feedforward_layernorm`.
    pub sandwich_norm: bool,
    /// Embeddings multiplied by sqrt(hidden_size), rounded to the parameter dtype (Gemma).
    pub scale_embeddings: bool,
    /// Attention scores scaled by `query_pre_attn_scalar^-0.5` instead of `head_dim^-0.5`.
    pub query_pre_attn_scalar: Option<f64>,
    /// Attention scores soft-capped, `cap * tanh(s / cap)`, before the mask (Gemma 2: 50).
    pub attn_logit_softcap: Option<f64>,
    /// Logits soft-capped the same way after the LM head (Gemma 2: 30).
    pub final_logit_softcap: Option<f64>,
    /// Per layer: full or sliding-window attention (`layer_types`); `num_hidden_layers` long.
    pub layer_types: Vec<AttentionKind>,
    /// The window of the sliding layers, in positions (the query's own included).
    pub sliding_window: Option<usize>,
    /// Per layer: whether it applies RoPE (SmolLM3's `no_rope_layers`: 0 = NoPE).
    pub rope_layers: Vec<bool>,
    /// The RoPE of the sliding-window layers when it differs from `rope` (Gemma 3's local base
    /// frequency).
    pub local_rope: Option<Rope>,
    /// OLMoE's q/k norms: over the whole projection (`q_norm` of hidden size) instead of per
    /// head; `qk_norm` is then false.
    pub qk_norm_whole: bool,
    /// OLMoE's `clip_qkv`: q, k and v clamped to [-c, c] after the projections.
    pub clip_qkv: Option<f64>,
    /// The mixture of experts, for MoE families.
    pub moe: Option<MoeConfig>,
    /// AFMoE's gated attention: the attention output times `sigmoid(x W_g)` (a `gate_proj` of
    /// the query's width) before `o_proj`.
    pub attn_output_gate: bool,
    /// DeepSeek-V3's multi-head latent attention (replaces q/k/v projections; `head_dim` is then
    /// `qk_rope_head_dim`, the rotated width).
    pub mla: Option<MlaConfig>,
    /// Multi-token prediction layers after the last layer (DeepSeek-V3's
    /// `num_nextn_predict_layers`): `model.layers.{num_hidden_layers + k}`.
    pub num_mtp_layers: usize,
    /// A classifier: `Some(labels)`, the `score.weight` head's outputs `[labels, hidden]` in
    /// place of the LM head; `score_kind` says where it applies. `None`: a causal LM.
    pub score_labels: Option<usize>,
    /// Where a classifier's head applies (ignored when `score_labels` is `None`).
    pub score_kind: ScoreKind,
    /// The source config.json's fields, kept so `save` preserves what we do not model
    /// (token ids of pad, `use_cache`, ...). Empty for configs built in code.
    pub source_fields: Map<String, Value>,
}

impl ModelConfig {
    /// Query heads per key/value head.
    pub fn num_query_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Whether the model is the plain Llama/Qwen block everywhere: SwiGLU, pre-norms with plain
    /// weights, RoPE and full attention in every layer, `head_dim^-0.5` scaling and no
    /// soft-caps. The fused CPU paths (`fused_block`, `decode_step`) and GGUF export take these
    /// models only; every other model runs the op composition, which implements each variant.
    pub fn is_plain(&self) -> bool {
        self.hidden_act == Activation::Silu
            && !self.norm_unit_offset
            && !self.sandwich_norm
            && !self.scale_embeddings
            && self.query_pre_attn_scalar.is_none()
            && self.attn_logit_softcap.is_none()
            && self.final_logit_softcap.is_none()
            && self.layer_types.iter().all(|&k| k == AttentionKind::Full)
            && self.rope_layers.iter().all(|&r| r)
            && self.local_rope.is_none()
            && !self.qk_norm_whole
            && self.clip_qkv.is_none()
            && self.moe.is_none()
            && !self.attn_output_gate
            && self.mla.is_none()
    }

    /// Whether `layer`'s MLP is a mixture of experts.
    /// Layers past `num_hidden_layers` are the multi-token prediction modules' blocks, which
    /// are always sparse in an MoE model (transformers' `get_mtp_config` sets
    /// `first_k_dense_replace = 0` for them).
    pub fn is_sparse_layer(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| {
            m.sparse_layers
                .get(layer)
                .copied()
                .unwrap_or(layer >= self.num_hidden_layers)
        })
    }

    /// The attention kind of `layer` (full when out of range).
    pub fn attention_kind(&self, layer: usize) -> AttentionKind {
        self.layer_types
            .get(layer)
            .copied()
            .unwrap_or(AttentionKind::Full)
    }

    /// The sliding window of `layer` in positions; `None` for full attention.
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        match self.attention_kind(layer) {
            AttentionKind::Sliding => self.sliding_window,
            AttentionKind::Full => None,
        }
    }

    /// Whether `layer` applies RoPE to its queries and keys.
    pub fn uses_rope(&self, layer: usize) -> bool {
        self.rope_layers.get(layer).copied().unwrap_or(true)
    }

    /// The factor attention scores are multiplied by before the softmax.
    pub fn attention_scale(&self) -> f64 {
        if let Some(mla) = &self.mla {
            // DeepseekV3Attention: qk_head_dim^-0.5, times mscale² under YaRN with
            // `mscale_all_dim` (yarn_get_mscale: 0.1 · mscale_all_dim · ln(factor) + 1).
            let base = 1.0 / (mla.qk_head_dim() as f64).sqrt();
            return match &self.rope.scaling {
                RopeScaling::Yarn {
                    factor,
                    mscale_all_dim: Some(m),
                    original_max_position_embeddings,
                    ..
                } if *m != 0.0 => {
                    let factor = factor.unwrap_or(
                        self.max_position_embeddings as f64
                            / *original_max_position_embeddings as f64,
                    );
                    let mscale = if factor <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * factor.ln() + 1.0
                    };
                    base * mscale * mscale
                }
                _ => base,
            };
        }
        match self.query_pre_attn_scalar {
            Some(s) => 1.0 / s.sqrt(),
            None => 1.0 / (self.head_dim as f64).sqrt(),
        }
    }

    /// Whether weights of a model of `other` can replace this one's mid-generation (live weight
    /// updates): every field that shapes the computation is equal. The source fields (how the
    /// file spelled things: `rope_theta` or `rope_parameters`, `transformers_version`, ...) and
    /// the special token ids do not count.
    pub fn same_layout(&self, other: &ModelConfig) -> bool {
        let strip = |c: &ModelConfig| ModelConfig {
            source_fields: Map::new(),
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            ..c.clone()
        };
        strip(self) == strip(other)
    }
}
