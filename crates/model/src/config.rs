//! Model configuration: Hugging Face `config.json` (file format) -> validated `ModelConfig`.
//!
//! Two layers. `HfConfigFile` mirrors the JSON written by transformers 4.x (`rope_theta` +
//! `rope_scaling`) and 5.x (`rope_parameters`). Unknown keys are accepted on purpose: HF
//! configs carry dozens of fields irrelevant to the computation (`use_cache`, `torch_dtype`,
//! `transformers_version`, ...). What is *not* accepted silently: an architecture or
//! `model_type` we do not implement, a RoPE type we do not implement, and settings that would
//! change the computation without us honouring them (an activation we do not implement, sliding
//! windows on Llama/Qwen, `partial_rotary_factor` != 1, per-layer RoPE dictionaries outside
//! Gemma 3, NoPE layers outside SmolLM3, bidirectional attention).
//!
//! `ModelConfig` is the runtime description the transformer is built from; `Architecture` is
//! the one place where the differences between the families are decided (their defaults follow
//! transformers' config classes: Gemma 2's caps 50/30 when the keys are absent, an explicit null
//! turning them off).
//! Defaults for missing optional fields follow transformers' config classes; RoPE semantics
//! follow transformers 5.x `modeling_rope_utils` (see rotary.rs).

use crate::error::ModelError;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The model families this crate implements; matched in one place (`Architecture::traits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
    /// Gemma 2: GeGLU, sandwich norms, (1 + w) RMSNorm, scaled embeddings, attention and
    /// final-logit soft-capping, sliding-window layers alternating with global ones.
    Gemma2,
    /// Gemma 3 (text, `Gemma3ForCausalLM`): Gemma 2's block with q/k norms instead of the
    /// attention soft-cap, and a separate RoPE for the sliding-window layers.
    Gemma3Text,
    /// SmolLM3: Llama with NoPE layers (`no_rope_layers`).
    SmolLm3,
    /// Mixtral: every MLP a mixture of experts, softmax router, top-k renormalized.
    Mixtral,
    /// Qwen2-MoE: Qwen2 attention, experts plus a shared expert behind a sigmoid gate.
    Qwen2Moe,
    /// Qwen3-MoE: Qwen3 attention (per-head q/k norms), experts.
    Qwen3Moe,
    /// OLMoE: q/k norms over the whole projection, optional q/k/v clipping, experts.
    Olmoe,
    /// AFMoE (Arcee Trinity): gated attention, sandwich norms, per-head q/k norms, sliding-window
    /// layers with RoPE and global NoPE layers, a sigmoid router with a selection bias, shared
    /// experts, dense first layers.
    Afmoe,
    /// DeepSeek-V3: multi-head latent attention (`MlaConfig`), a sigmoid router choosing within
    /// the best expert groups on score + `e_score_correction_bias`, shared experts, dense first
    /// layers, and multi-token prediction layers (`num_nextn_predict_layers`).
    DeepseekV3,
}

/// Structural choices implied by the architecture (before config overrides).
struct ArchitectureTraits {
    qkv_bias_forced: bool,
    qk_norm: bool,
    default_max_position_embeddings: usize,
    default_head_dim: Option<usize>,
    default_tie_word_embeddings: bool,
    default_rope_theta: f64,
    /// The Gemma block: sandwich norms, (1 + w) norms, embeddings scaled by sqrt(hidden),
    /// `hidden_activation`, `query_pre_attn_scalar`.
    gemma: bool,
}

impl Architecture {
    pub const ALL: [Architecture; 12] = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma2,
        Architecture::Gemma3Text,
        Architecture::SmolLm3,
        Architecture::Mixtral,
        Architecture::Qwen2Moe,
        Architecture::Qwen3Moe,
        Architecture::Olmoe,
        Architecture::Afmoe,
        Architecture::DeepseekV3,
    ];

    pub fn hf_class_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Gemma2 => "Gemma2ForCausalLM",
            Architecture::Gemma3Text => "Gemma3ForCausalLM",
            Architecture::SmolLm3 => "SmolLM3ForCausalLM",
            Architecture::Mixtral => "MixtralForCausalLM",
            Architecture::Qwen2Moe => "Qwen2MoeForCausalLM",
            Architecture::Qwen3Moe => "Qwen3MoeForCausalLM",
            Architecture::Olmoe => "OlmoeForCausalLM",
            Architecture::Afmoe => "AfmoeForCausalLM",
            Architecture::DeepseekV3 => "DeepseekV3ForCausalLM",
        }
    }

    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3Text => "gemma3_text",
            Architecture::SmolLm3 => "smollm3",
            Architecture::Mixtral => "mixtral",
            Architecture::Qwen2Moe => "qwen2_moe",
            Architecture::Qwen3Moe => "qwen3_moe",
            Architecture::Olmoe => "olmoe",
            Architecture::Afmoe => "afmoe",
            Architecture::DeepseekV3 => "deepseek_v3",
        }
    }

    fn traits(self) -> ArchitectureTraits {
        match self {
            // LlamaAttention: q/k/v/o biases follow `attention_bias` (default false).
            Architecture::Llama => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: false,
                default_max_position_embeddings: 2048,
                default_head_dim: None,
                default_tie_word_embeddings: false,
                default_rope_theta: 10_000.0,
                gemma: false,
            },
            // Qwen2Attention: q/k/v always have biases, o_proj never.
            Architecture::Qwen2 => ArchitectureTraits {
                qkv_bias_forced: true,
                qk_norm: false,
                default_max_position_embeddings: 32768,
                default_head_dim: None,
                default_tie_word_embeddings: false,
                default_rope_theta: 10_000.0,
                gemma: false,
            },
            // Qwen3Attention: RMSNorm over head_dim on q and k before RoPE; head_dim default 128.
            Architecture::Qwen3 => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: true,
                default_max_position_embeddings: 32768,
                default_head_dim: Some(128),
                default_tie_word_embeddings: false,
                default_rope_theta: 10_000.0,
                gemma: false,
            },
            // Gemma2Config's defaults.
            Architecture::Gemma2 => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: false,
                default_max_position_embeddings: 8192,
                default_head_dim: Some(256),
                default_tie_word_embeddings: true,
                default_rope_theta: 10_000.0,
                gemma: true,
            },
            // Gemma3TextConfig's defaults (the global layers' theta; local layers 10,000).
            Architecture::Gemma3Text => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: true,
                default_max_position_embeddings: 131_072,
                default_head_dim: Some(256),
                default_tie_word_embeddings: true,
                default_rope_theta: 1_000_000.0,
                gemma: true,
            },
            // SmolLM3Config's defaults.
            Architecture::SmolLm3 => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: false,
                default_max_position_embeddings: 32768,
                default_head_dim: None,
                default_tie_word_embeddings: true,
                default_rope_theta: 2_000_000.0,
                gemma: false,
            },
            Architecture::Mixtral => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: false,
                default_max_position_embeddings: 4096 * 32,
                default_head_dim: None,
                default_tie_word_embeddings: false,
                default_rope_theta: 1_000_000.0,
                gemma: false,
            },
            // q/k/v biases follow `qkv_bias` (default true), o_proj never (see `validate`).
            Architecture::Qwen2Moe => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: false,
                default_max_position_embeddings: 32768,
                default_head_dim: None,
                default_tie_word_embeddings: false,
                default_rope_theta: 10_000.0,
                gemma: false,
            },
            // Qwen3MoeConfig has no head_dim default of its own: hidden / heads.
            Architecture::Qwen3Moe => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: true,
                default_max_position_embeddings: 32768,
                default_head_dim: None,
                default_tie_word_embeddings: false,
                default_rope_theta: 10_000.0,
                gemma: false,
            },
            Architecture::Olmoe => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: false,
                default_max_position_embeddings: 4096,
                default_head_dim: None,
                default_tie_word_embeddings: false,
                default_rope_theta: 10_000.0,
                gemma: false,
            },
            // AfmoeConfig's defaults.
            Architecture::Afmoe => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: true,
                default_max_position_embeddings: 16384,
                default_head_dim: Some(128),
                default_tie_word_embeddings: false,
                default_rope_theta: 10_000.0,
                gemma: false,
            },
            // DeepseekV3Config's defaults (head_dim is qk_rope_head_dim, see `MlaConfig`).
            Architecture::DeepseekV3 => ArchitectureTraits {
                qkv_bias_forced: false,
                qk_norm: false,
                default_max_position_embeddings: 4096,
                default_head_dim: None,
                default_tie_word_embeddings: false,
                default_rope_theta: 10_000.0,
                gemma: false,
            },
        }
    }

    fn from_hf_class(name: &str) -> Option<Architecture> {
        Architecture::ALL
            .into_iter()
            .find(|a| a.hf_class_name() == name)
    }

    fn from_model_type(name: &str) -> Option<Architecture> {
        Architecture::ALL
            .into_iter()
            .find(|a| a.model_type() == name)
    }
}

/// Rotary embedding: base frequency and the frequency-scaling scheme.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// The RoPE types of transformers' `ROPE_INIT_FUNCTIONS` that we implement. Values are kept
/// as written in the config (unresolved options stay `None`) so `save` writes them back.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    Yarn {
        /// `None`: derived as max_position_embeddings / original_max_position_embeddings.
        factor: Option<f64>,
        attention_factor: Option<f64>,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        beta_fast: Option<f64>,
        beta_slow: Option<f64>,
        original_max_position_embeddings: usize,
        truncate: Option<bool>,
    },
}

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

    fn from_hf_name(name: &str) -> Option<Activation> {
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
    fn hf_name(self) -> &'static str {
        match self {
            AttentionKind::Full => "full_attention",
            AttentionKind::Sliding => "sliding_attention",
        }
    }
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
    /// The source config.json's fields, kept so `save` preserves what we do not model
    /// (token ids of pad, `use_cache`, ...). Empty for configs built in code.
    pub source_fields: Map<String, Value>,
}

/// transformers' config.json, the fields that matter to the computation.
#[derive(Debug, Deserialize)]
struct HfConfigFile {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<HfRopeParameters>,
    rope_parameters: Option<HfRopeParameters>,
    partial_rotary_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    use_sliding_window: Option<bool>,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    no_rope_layers: Option<Vec<u8>>,
    no_rope_layer_interval: Option<usize>,
    sliding_window_pattern: Option<usize>,
    query_pre_attn_scalar: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
    rope_local_base_freq: Option<f64>,
    use_bidirectional_attention: Option<bool>,
    qkv_bias: Option<bool>,
    clip_qkv: Option<f64>,
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_shared_experts: Option<usize>,
    num_dense_layers: Option<usize>,
    route_scale: Option<f64>,
    global_attn_every_n_layers: Option<usize>,
    mup_enabled: Option<bool>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    router_aux_loss_coef: Option<f64>,
    q_lora_rank: Option<usize>,
    kv_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    rope_interleave: Option<bool>,
    n_routed_experts: Option<usize>,
    n_shared_experts: Option<usize>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    routed_scaling_factor: Option<f64>,
    first_k_dense_replace: Option<usize>,
    num_nextn_predict_layers: Option<usize>,
    num_mtp_layers: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

/// `rope_scaling` (4.x) or `rope_parameters` (5.x).
#[derive(Debug, Deserialize)]
struct HfRopeParameters {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    rope_theta: Option<f64>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    attention_factor: Option<f64>,
    mscale: Option<f64>,
    mscale_all_dim: Option<f64>,
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
    truncate: Option<bool>,
    partial_rotary_factor: Option<f64>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

const SUPPORTED_ARCHITECTURES: &str = "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, \
     Gemma2ForCausalLM, Gemma3ForCausalLM, SmolLM3ForCausalLM, MixtralForCausalLM, \
     Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, AfmoeForCausalLM, \
     DeepseekV3ForCausalLM";
const SUPPORTED_MODEL_TYPES: &str = "llama, qwen2, qwen3, gemma2, gemma3_text, smollm3, mixtral, \
     qwen2_moe, qwen3_moe, olmoe, afmoe, deepseek_v3";
const SUPPORTED_ACTIVATIONS: &str = "silu, gelu_pytorch_tanh, gelu_new, gelu, relu2";
const SUPPORTED_ROPE_TYPES: &str = "default, linear, llama3, yarn";

impl ModelConfig {
    /// Reads and validates a Hugging Face config.json.
    pub fn from_file(path: &Path) -> Result<ModelConfig, ModelError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ModelError::MissingFile {
                    path: path.to_path_buf(),
                    hint: String::new(),
                });
            }
            Err(e) => return Err(ModelError::io(path, e)),
        };
        Self::from_json_str(&text, path)
    }

    /// Parses config.json text; `path` is used in error messages only.
    pub fn from_json_str(text: &str, path: &Path) -> Result<ModelConfig, ModelError> {
        let malformed = |field: String, message: String| ModelError::MalformedJson {
            path: path.to_path_buf(),
            field,
            message,
        };
        let raw: Value = serde_json::from_str(text)
            .map_err(|e| malformed("<document>".into(), e.to_string()))?;
        let Value::Object(source_fields) = raw.clone() else {
            return Err(malformed(
                "<document>".into(),
                "expected a JSON object".into(),
            ));
        };
        let file: HfConfigFile = serde_path_to_error::deserialize(raw)
            .map_err(|e| malformed(e.path().to_string(), e.inner().to_string()))?;
        Validator { path }.validate(file, source_fields)
    }

    /// Number of scalar parameters (tied embeddings counted once).
    pub fn num_parameters(&self) -> usize {
        crate::transformer::parameter_shapes(self)
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>())
            .sum()
    }

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

    /// The config.json transformers loads back: the source fields we do not model, overwritten
    /// with ours. RoPE is written in the 4.x form (`rope_theta` + `rope_scaling`), which both
    /// transformers 4.x and 5.x read; `rope_parameters` is dropped to avoid two sources of truth.
    pub fn to_hf_json(&self) -> Value {
        let mut out = self.source_fields.clone();
        let traits = self.architecture.traits();
        let had_layer_types = out.contains_key("layer_types");
        let mut set = |key: &str, value: Value| {
            out.insert(key.to_string(), value);
        };
        set(
            "architectures",
            Value::from(vec![self.architecture.hf_class_name()]),
        );
        set("model_type", self.architecture.model_type().into());
        set("vocab_size", self.vocab_size.into());
        set("hidden_size", self.hidden_size.into());
        set("intermediate_size", self.intermediate_size.into());
        set("num_hidden_layers", self.num_hidden_layers.into());
        set("num_attention_heads", self.num_attention_heads.into());
        set("num_key_value_heads", self.num_key_value_heads.into());
        set("head_dim", self.head_dim.into());
        set("rms_norm_eps", self.rms_norm_eps.into());
        set("hidden_act", self.hidden_act.hf_name().into());
        if traits.gemma {
            set("hidden_activation", self.hidden_act.hf_name().into());
        }
        set(
            "max_position_embeddings",
            self.max_position_embeddings.into(),
        );
        set("tie_word_embeddings", self.tie_word_embeddings.into());
        if !traits.qkv_bias_forced {
            set("attention_bias", self.attention_bias.into());
        }
        if matches!(
            self.architecture,
            Architecture::Llama | Architecture::SmolLm3
        ) {
            set("mlp_bias", self.mlp_bias.into());
        }
        let optional = |v: Option<f64>| v.map_or(Value::Null, Value::from);
        if traits.gemma {
            // An int in transformers' config classes (strictly validated on load).
            let scalar = match self.query_pre_attn_scalar {
                Some(v) if v.fract() == 0.0 && v.abs() < 9.0e15 => Value::from(v as i64),
                other => optional(other),
            };
            set("query_pre_attn_scalar", scalar);
            set("attn_logit_softcapping", optional(self.attn_logit_softcap));
            set(
                "final_logit_softcapping",
                optional(self.final_logit_softcap),
            );
        }
        let sliding = self.layer_types.contains(&AttentionKind::Sliding);
        if traits.gemma || sliding || had_layer_types {
            set(
                "layer_types",
                Value::from(
                    self.layer_types
                        .iter()
                        .map(|k| k.hf_name())
                        .collect::<Vec<_>>(),
                ),
            );
        }
        if traits.gemma || sliding || self.architecture == Architecture::Afmoe {
            set(
                "sliding_window",
                self.sliding_window.map_or(Value::Null, Value::from),
            );
        }
        if self.architecture == Architecture::SmolLm3 {
            set("use_sliding_window", sliding.into());
            set(
                "no_rope_layers",
                Value::from(
                    self.rope_layers
                        .iter()
                        .map(|&r| u8::from(r))
                        .collect::<Vec<_>>(),
                ),
            );
        }
        if self.architecture == Architecture::Qwen2Moe {
            set("qkv_bias", self.attention_bias.into());
        }
        if self.architecture == Architecture::Olmoe {
            set("clip_qkv", optional(self.clip_qkv));
        }
        if self.architecture == Architecture::Mixtral {
            set(
                "sliding_window",
                self.sliding_window.map_or(Value::Null, Value::from),
            );
        }
        if let Some(moe) = &self.moe {
            let experts_key = match moe.naming {
                ExpertNaming::Mixtral => "num_local_experts",
                ExpertNaming::Qwen | ExpertNaming::Afmoe => "num_experts",
                ExpertNaming::Deepseek => "n_routed_experts",
            };
            set(experts_key, moe.num_experts.into());
            set("num_experts_per_tok", moe.num_experts_per_tok.into());
            set("router_aux_loss_coef", moe.router_aux_loss_coef.into());
            if moe.naming == ExpertNaming::Qwen {
                set("norm_topk_prob", moe.norm_topk_prob.into());
            }
            if matches!(
                self.architecture,
                Architecture::Qwen2Moe | Architecture::Qwen3Moe
            ) {
                set("moe_intermediate_size", moe.expert_intermediate_size.into());
                // The sparse layers as transformers derives them: step 1, the dense ones listed.
                set("decoder_sparse_step", 1.into());
                let dense: Vec<usize> = (0..self.num_hidden_layers)
                    .filter(|&l| !moe.sparse_layers[l])
                    .collect();
                set("mlp_only_layers", Value::from(dense));
            }
            if self.architecture == Architecture::Afmoe {
                set("moe_intermediate_size", moe.expert_intermediate_size.into());
                let dense = moe.sparse_layers.iter().take_while(|&&s| !s).count();
                set("num_dense_layers", dense.into());
                let shared = moe
                    .shared_expert_intermediate_size
                    .map_or(0, |s| s / moe.expert_intermediate_size.max(1));
                set("num_shared_experts", shared.into());
                if let RouterScore::Sigmoid { route_scale } = moe.router_score {
                    set("route_scale", route_scale.into());
                }
                set("mup_enabled", self.scale_embeddings.into());
            } else if self.architecture == Architecture::DeepseekV3 {
                set("moe_intermediate_size", moe.expert_intermediate_size.into());
                set("norm_topk_prob", moe.norm_topk_prob.into());
                let dense = moe.sparse_layers.iter().take_while(|&&s| !s).count();
                set("first_k_dense_replace", dense.into());
                let shared = moe
                    .shared_expert_intermediate_size
                    .map_or(0, |s| s / moe.expert_intermediate_size.max(1));
                set("n_shared_experts", shared.into());
                if let RouterScore::Sigmoid { route_scale } = moe.router_score {
                    set("routed_scaling_factor", route_scale.into());
                }
                let (groups, topk) = moe
                    .group_limit
                    .map_or((1, 1), |g| (g.groups, g.topk_groups));
                set("n_group", groups.into());
                set("topk_group", topk.into());
            } else if let Some(shared) = moe.shared_expert_intermediate_size {
                set("shared_expert_intermediate_size", shared.into());
            }
        }
        if let Some(mla) = &self.mla {
            set(
                "q_lora_rank",
                mla.q_lora_rank.map_or(Value::Null, Value::from),
            );
            set("kv_lora_rank", mla.kv_lora_rank.into());
            set("qk_nope_head_dim", mla.qk_nope_head_dim.into());
            set("qk_rope_head_dim", mla.qk_rope_head_dim.into());
            set("v_head_dim", mla.v_head_dim.into());
            set("rope_interleave", mla.rope_interleave.into());
        }
        if self.architecture == Architecture::DeepseekV3 {
            set("num_nextn_predict_layers", self.num_mtp_layers.into());
        }
        if let Some(local) = &self.local_rope {
            // transformers 5.x reads the 4.x keys of Gemma 3: rope_local_base_freq for the
            // sliding layers (always the default RoPE type there).
            set("rope_local_base_freq", local.theta.into());
        }
        set(
            "bos_token_id",
            self.bos_token_id.map_or(Value::Null, Value::from),
        );
        set(
            "eos_token_id",
            match self.eos_token_ids.as_slice() {
                [] => Value::Null,
                [one] => (*one).into(),
                many => Value::from(many.to_vec()),
            },
        );
        set("torch_dtype", "float32".into());
        set("dtype", "float32".into());
        set("rope_theta", self.rope.theta.into());
        set("rope_scaling", rope_scaling_json(&self.rope.scaling));
        out.remove("rope_parameters");
        // One spelling of the MTP layer count (num_nextn_predict_layers, written above).
        out.remove("num_mtp_layers");
        Value::Object(out)
    }
}

fn rope_scaling_json(scaling: &RopeScaling) -> Value {
    let mut map = Map::new();
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            map.insert(key.to_string(), value);
        }
    };
    match scaling {
        RopeScaling::Default => return Value::Null,
        RopeScaling::Linear { factor } => {
            put("rope_type", Some("linear".into()));
            put("factor", Some((*factor).into()));
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            put("rope_type", Some("llama3".into()));
            put("factor", Some((*factor).into()));
            put("low_freq_factor", Some((*low_freq_factor).into()));
            put("high_freq_factor", Some((*high_freq_factor).into()));
            put(
                "original_max_position_embeddings",
                Some((*original_max_position_embeddings).into()),
            );
        }
        RopeScaling::Yarn {
            factor,
            attention_factor,
            mscale,
            mscale_all_dim,
            beta_fast,
            beta_slow,
            original_max_position_embeddings,
            truncate,
        } => {
            put("rope_type", Some("yarn".into()));
            put("factor", factor.map(Value::from));
            put("attention_factor", attention_factor.map(Value::from));
            put("mscale", mscale.map(Value::from));
            put("mscale_all_dim", mscale_all_dim.map(Value::from));
            put("beta_fast", beta_fast.map(Value::from));
            put("beta_slow", beta_slow.map(Value::from));
            put(
                "original_max_position_embeddings",
                Some((*original_max_position_embeddings).into()),
            );
            put("truncate", truncate.map(Value::from));
        }
    }
    Value::Object(map)
}

/// Carries the file path into every error.
struct Validator<'a> {
    path: &'a Path,
}

impl Validator<'_> {
    fn invalid(&self, field: &str, message: impl Into<String>) -> ModelError {
        ModelError::InvalidConfig {
            path: self.path.to_path_buf(),
            field: field.to_string(),
            message: message.into(),
        }
    }

    fn unsupported(&self, field: &str, value: impl Into<String>, supported: &str) -> ModelError {
        ModelError::Unsupported {
            path: self.path.to_path_buf(),
            field: field.to_string(),
            value: value.into(),
            supported: supported.to_string(),
        }
    }

    fn required(&self, value: Option<usize>, field: &str) -> Result<usize, ModelError> {
        match value {
            None => Err(self.invalid(field, "missing (required)")),
            Some(0) => Err(self.invalid(field, "must be positive, found 0")),
            Some(v) => Ok(v),
        }
    }

    fn architecture(&self, file: &HfConfigFile) -> Result<Architecture, ModelError> {
        let from_type = match &file.model_type {
            Some(t) => Some(Architecture::from_model_type(t).ok_or_else(|| {
                self.unsupported("model_type", format!("{t:?}"), SUPPORTED_MODEL_TYPES)
            })?),
            None => None,
        };
        let from_class = match file.architectures.as_deref() {
            Some([one]) => Some(Architecture::from_hf_class(one).ok_or_else(|| {
                self.unsupported("architectures", format!("{one:?}"), SUPPORTED_ARCHITECTURES)
            })?),
            Some(other) if !other.is_empty() => {
                return Err(self.unsupported(
                    "architectures",
                    format!("{other:?}"),
                    "exactly one architecture",
                ));
            }
            _ => None,
        };
        match (from_class, from_type) {
            (Some(a), Some(b)) if a != b => Err(self.invalid(
                "model_type",
                format!(
                    "{:?} contradicts architectures {:?}",
                    b.model_type(),
                    a.hf_class_name()
                ),
            )),
            (Some(a), _) | (None, Some(a)) => Ok(a),
            (None, None) => Err(self.invalid(
                "architectures",
                "neither `architectures` nor `model_type` is given",
            )),
        }
    }

    fn validate(
        &self,
        file: HfConfigFile,
        source_fields: Map<String, Value>,
    ) -> Result<ModelConfig, ModelError> {
        let architecture = self.architecture(&file)?;
        let traits = architecture.traits();
        let vocab_size = self.required(file.vocab_size, "vocab_size")?;
        let hidden_size = self.required(file.hidden_size, "hidden_size")?;
        let intermediate_size = self.required(file.intermediate_size, "intermediate_size")?;
        let num_hidden_layers = self.required(file.num_hidden_layers, "num_hidden_layers")?;
        let num_attention_heads = self.required(file.num_attention_heads, "num_attention_heads")?;
        let num_key_value_heads = self.required(
            Some(file.num_key_value_heads.unwrap_or(num_attention_heads)),
            "num_key_value_heads",
        )?;
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(self.invalid(
                "num_key_value_heads",
                format!("{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"),
            ));
        }
        let mla = self.mla(&file, &source_fields, architecture)?;
        if mla.is_some() && num_key_value_heads != num_attention_heads {
            // kv_b_proj expands the latent into every query head's key and value.
            return Err(self.invalid(
                "num_key_value_heads",
                format!(
                    "{num_key_value_heads} with latent attention, which has one key/value head \
                     per query head ({num_attention_heads})"
                ),
            ));
        }
        let head_dim = match &mla {
            // DeepseekV3Config sets head_dim to the rotated width (its RoPE table's).
            Some(mla) => mla.qk_rope_head_dim,
            None => file
                .head_dim
                .or(traits.default_head_dim)
                .unwrap_or(hidden_size / num_attention_heads),
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(self.invalid(
                "head_dim",
                format!("must be even and positive for RoPE, found {head_dim}"),
            ));
        }
        let rms_norm_eps = file.rms_norm_eps.unwrap_or(1e-6);
        if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
            return Err(self.invalid(
                "rms_norm_eps",
                format!("must be positive, found {rms_norm_eps}"),
            ));
        }
        // Gemma names the MLP activation `hidden_activation` (hub configs often carry both).
        let (act_field, act_name) = match (&file.hidden_activation, &file.hidden_act) {
            (Some(a), _) if traits.gemma => ("hidden_activation", a.as_str()),
            (_, Some(a)) => ("hidden_act", a.as_str()),
            _ if traits.gemma => ("hidden_activation", "gelu_pytorch_tanh"),
            _ => ("hidden_act", "silu"),
        };
        let hidden_act = Activation::from_hf_name(act_name).ok_or_else(|| {
            self.unsupported(act_field, format!("{act_name:?}"), SUPPORTED_ACTIVATIONS)
        })?;
        if file.use_bidirectional_attention == Some(true) {
            return Err(self.unsupported("use_bidirectional_attention", "true", "false (causal)"));
        }
        let layer_types = self.layer_types(&file, architecture, num_hidden_layers)?;
        let rope_layers = match architecture {
            // AfmoeAttention rotates only in its sliding-window layers; the global ones are NoPE.
            Architecture::Afmoe => layer_types
                .iter()
                .map(|&k| k == AttentionKind::Sliding)
                .collect(),
            _ => self.rope_layers(&file, architecture, num_hidden_layers)?,
        };
        if let Some(f) = file.partial_rotary_factor
            && f != 1.0
        {
            return Err(self.unsupported("partial_rotary_factor", f.to_string(), "1.0"));
        }
        let max_position_embeddings = file
            .max_position_embeddings
            .unwrap_or(traits.default_max_position_embeddings);
        let (rope, local_rope) = self.ropes(&file, architecture, max_position_embeddings)?;
        let gemma_default = |key: &str,
                             given: Option<f64>,
                             default: Option<f64>|
         -> Result<Option<f64>, ModelError> {
            // An absent key takes the class default; an explicit null turns the feature off.
            let value = match source_fields.contains_key(key) {
                false if traits.gemma => default,
                _ => given,
            };
            match value {
                Some(v) if !(v > 0.0 && v.is_finite()) => {
                    Err(self.invalid(key, format!("must be positive, found {v}")))
                }
                v => Ok(v),
            }
        };
        let gemma2 = architecture == Architecture::Gemma2;
        let attn_logit_softcap = gemma_default(
            "attn_logit_softcapping",
            file.attn_logit_softcapping,
            gemma2.then_some(50.0),
        )?;
        let final_logit_softcap = gemma_default(
            "final_logit_softcapping",
            file.final_logit_softcapping,
            gemma2.then_some(30.0),
        )?;
        let query_pre_attn_scalar = gemma_default(
            "query_pre_attn_scalar",
            file.query_pre_attn_scalar,
            Some(256.0),
        )?;
        let sliding_window = match (source_fields.get("sliding_window"), traits.gemma) {
            (None, true) => Some(4096),
            (None, false) if architecture == Architecture::Afmoe => Some(1024),
            _ => file.sliding_window,
        };
        if layer_types.contains(&AttentionKind::Sliding) {
            match sliding_window {
                Some(0) => return Err(self.invalid("sliding_window", "must be positive, found 0")),
                None => {
                    return Err(self.invalid(
                        "sliding_window",
                        "missing (required when layer_types has sliding_attention layers)",
                    ));
                }
                Some(_) => {}
            }
        }
        // Unused windows are dropped so two configs that compute the same compare equal.
        let sliding_window =
            sliding_window.filter(|_| layer_types.contains(&AttentionKind::Sliding));
        let attention_bias_flag = file.attention_bias.unwrap_or(false);
        let (attention_bias, attention_output_bias) = match architecture {
            // Qwen2MoeAttention: q/k/v biases follow `qkv_bias`, o_proj never has one.
            Architecture::Qwen2Moe => (file.qkv_bias.unwrap_or(true), false),
            // MixtralAttention has no biases.
            Architecture::Mixtral => (false, false),
            // DeepseekV3Attention: q_a_proj, kv_a_proj_with_mqa and o_proj follow
            // `attention_bias`.
            Architecture::DeepseekV3 => (attention_bias_flag, attention_bias_flag),
            _ => (
                traits.qkv_bias_forced || attention_bias_flag,
                !traits.qkv_bias_forced && attention_bias_flag,
            ),
        };
        let clip_qkv = match (architecture, file.clip_qkv) {
            (Architecture::Olmoe, Some(c)) if !(c > 0.0 && c.is_finite()) => {
                return Err(self.invalid("clip_qkv", format!("must be positive, found {c}")));
            }
            (Architecture::Olmoe, c) => c,
            (_, Some(_)) => {
                return Err(self.unsupported("clip_qkv", "a clamp", "olmoe (elsewhere null)"));
            }
            (_, None) => None,
        };
        let moe = self.moe(&file, architecture, num_hidden_layers, intermediate_size)?;
        let num_mtp_layers = match (file.num_nextn_predict_layers, file.num_mtp_layers) {
            (Some(a), Some(b)) if a != b => {
                return Err(self.invalid(
                    "num_mtp_layers",
                    format!("{b} contradicts num_nextn_predict_layers {a}"),
                ));
            }
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => 0,
        };
        if num_mtp_layers > 0 && architecture != Architecture::DeepseekV3 {
            return Err(self.unsupported(
                "num_nextn_predict_layers",
                num_mtp_layers.to_string(),
                "deepseek_v3 (elsewhere 0)",
            ));
        }
        let mlp_bias = matches!(architecture, Architecture::Llama | Architecture::SmolLm3)
            && file.mlp_bias.unwrap_or(false);
        let eos_token_ids = match file.eos_token_id {
            None => Vec::new(),
            Some(OneOrMany::One(id)) => vec![id],
            Some(OneOrMany::Many(ids)) => ids,
        };
        Ok(ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            rope,
            attention_bias,
            attention_output_bias,
            mlp_bias,
            qk_norm: traits.qk_norm,
            tie_word_embeddings: file
                .tie_word_embeddings
                .unwrap_or(traits.default_tie_word_embeddings),
            max_position_embeddings,
            bos_token_id: file.bos_token_id,
            eos_token_ids,
            hidden_act,
            norm_unit_offset: traits.gemma,
            sandwich_norm: traits.gemma || architecture == Architecture::Afmoe,
            scale_embeddings: traits.gemma
                || (architecture == Architecture::Afmoe && file.mup_enabled == Some(true)),
            query_pre_attn_scalar,
            attn_logit_softcap,
            final_logit_softcap,
            layer_types,
            sliding_window,
            rope_layers,
            local_rope,
            qk_norm_whole: architecture == Architecture::Olmoe,
            attn_output_gate: architecture == Architecture::Afmoe,
            mla,
            num_mtp_layers,
            clip_qkv,
            moe,
            source_fields,
        })
    }

    /// The mixture of experts of the MoE families (`None` elsewhere), with transformers' config
    /// defaults. Qwen3-MoE's expert count is read from `num_experts` (hub checkpoints) or
    /// `num_local_experts` (what transformers 5.x may write); both given must agree.
    fn moe(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
        layers: usize,
        intermediate_size: usize,
    ) -> Result<Option<MoeConfig>, ModelError> {
        let (experts_default, top_k_default, aux_default) = match architecture {
            Architecture::Mixtral => (8, 2, 0.001),
            Architecture::Qwen2Moe => (60, 4, 0.001),
            Architecture::Qwen3Moe => (128, 8, 0.001),
            Architecture::Olmoe => (64, 8, 0.01),
            Architecture::Afmoe => (64, 6, 0.001),
            Architecture::DeepseekV3 => (256, 8, 0.001),
            _ => {
                for (field, present) in [
                    ("num_experts", file.num_experts.is_some()),
                    ("num_local_experts", file.num_local_experts.is_some()),
                ] {
                    if present {
                        return Err(self.unsupported(
                            field,
                            "experts",
                            "mixtral, qwen2_moe, qwen3_moe, olmoe, afmoe",
                        ));
                    }
                }
                return Ok(None);
            }
        };
        // DeepseekV3Config names its experts `n_routed_experts` (`num_local_experts` is an alias).
        let named_experts = match architecture {
            Architecture::DeepseekV3 => file.n_routed_experts,
            _ => file.num_experts,
        };
        let num_experts = match (named_experts, file.num_local_experts) {
            (Some(a), Some(b)) if a != b => {
                return Err(self.invalid(
                    "num_local_experts",
                    format!("{b} contradicts the expert count {a}"),
                ));
            }
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => experts_default,
        };
        let expert_field =
            if file.num_local_experts.is_some() || architecture == Architecture::Mixtral {
                "num_local_experts"
            } else if architecture == Architecture::DeepseekV3 {
                "n_routed_experts"
            } else {
                "num_experts"
            };
        let step = file.decoder_sparse_step.unwrap_or(1);
        if step == 0 {
            return Err(self.invalid("decoder_sparse_step", "must be positive, found 0"));
        }
        let dense_only = file.mlp_only_layers.clone().unwrap_or_default();
        if let Some(bad) = dense_only.iter().find(|&&l| l >= layers) {
            return Err(self.invalid(
                "mlp_only_layers",
                format!("layer {bad} is past the model's {layers} layers"),
            ));
        }
        let sparse_layers: Vec<bool> = (0..layers)
            .map(|i| match architecture {
                Architecture::Qwen2Moe | Architecture::Qwen3Moe => {
                    !dense_only.contains(&i) && num_experts > 0 && (i + 1) % step == 0
                }
                // AfmoeDecoderLayer: the first `num_dense_layers` are dense.
                Architecture::Afmoe => i >= file.num_dense_layers.unwrap_or(1),
                // DeepseekV3DecoderLayer: the first `first_k_dense_replace` are dense.
                Architecture::DeepseekV3 => i >= file.first_k_dense_replace.unwrap_or(3),
                _ => true,
            })
            .collect();
        let top_k = file.num_experts_per_tok.unwrap_or(top_k_default);
        if sparse_layers.contains(&true) {
            if num_experts == 0 {
                return Err(self.invalid(expert_field, "must be positive, found 0"));
            }
            if top_k == 0 || top_k > num_experts {
                return Err(self.invalid(
                    "num_experts_per_tok",
                    format!("{top_k} must be between 1 and {expert_field} ({num_experts})"),
                ));
            }
        }
        let expert_intermediate_size = match architecture {
            Architecture::Qwen2Moe
            | Architecture::Qwen3Moe
            | Architecture::Afmoe
            | Architecture::DeepseekV3 => {
                let default = match architecture {
                    Architecture::Qwen3Moe => 768,
                    Architecture::DeepseekV3 => 2048,
                    _ => 1408,
                };
                self.required(
                    Some(file.moe_intermediate_size.unwrap_or(default)),
                    "moe_intermediate_size",
                )?
            }
            _ => intermediate_size,
        };
        let shared_expert_intermediate_size = match architecture {
            Architecture::Qwen2Moe => Some(self.required(
                Some(file.shared_expert_intermediate_size.unwrap_or(5632)),
                "shared_expert_intermediate_size",
            )?),
            Architecture::Afmoe => match file.num_shared_experts.unwrap_or(2) {
                0 => None,
                n => Some(expert_intermediate_size * n),
            },
            Architecture::DeepseekV3 => match file.n_shared_experts.unwrap_or(1) {
                0 => None,
                n => Some(expert_intermediate_size * n),
            },
            _ => None,
        };
        let router_score = match architecture {
            Architecture::Afmoe => {
                let route_scale = file.route_scale.unwrap_or(1.0);
                if !(route_scale.is_finite() && route_scale > 0.0) {
                    return Err(self.invalid(
                        "route_scale",
                        format!("must be positive, found {route_scale}"),
                    ));
                }
                RouterScore::Sigmoid { route_scale }
            }
            Architecture::DeepseekV3 => {
                let route_scale = file.routed_scaling_factor.unwrap_or(2.5);
                if !(route_scale.is_finite() && route_scale > 0.0) {
                    return Err(self.invalid(
                        "routed_scaling_factor",
                        format!("must be positive, found {route_scale}"),
                    ));
                }
                RouterScore::Sigmoid { route_scale }
            }
            _ => RouterScore::Softmax,
        };
        let group_limit = match architecture {
            Architecture::DeepseekV3 => {
                let groups = file.n_group.unwrap_or(8);
                let topk_groups = file.topk_group.unwrap_or(4);
                if groups == 0 || !num_experts.is_multiple_of(groups) {
                    return Err(self.invalid(
                        "n_group",
                        format!("{groups} does not divide {expert_field} ({num_experts})"),
                    ));
                }
                if topk_groups == 0 || topk_groups > groups {
                    return Err(self.invalid(
                        "topk_group",
                        format!("{topk_groups} must be between 1 and n_group ({groups})"),
                    ));
                }
                // Each group is scored by its best two experts (DeepseekV3TopkRouter).
                if num_experts / groups < 2 && groups > 1 {
                    return Err(self.invalid(
                        "n_group",
                        format!(
                            "{groups} groups of {} expert(s): each group needs 2 (its score is \
                             the sum of its best two)",
                            num_experts / groups
                        ),
                    ));
                }
                if top_k > topk_groups * (num_experts / groups) {
                    return Err(self.invalid(
                        "num_experts_per_tok",
                        format!(
                            "{top_k} is more than the {} experts of topk_group ({topk_groups}) \
                             groups",
                            topk_groups * (num_experts / groups)
                        ),
                    ));
                }
                Some(GroupLimit {
                    groups,
                    topk_groups,
                })
            }
            _ => None,
        };
        let router_aux_loss_coef = file.router_aux_loss_coef.unwrap_or(aux_default);
        if !(router_aux_loss_coef >= 0.0 && router_aux_loss_coef.is_finite()) {
            return Err(self.invalid(
                "router_aux_loss_coef",
                format!("must be >= 0, found {router_aux_loss_coef}"),
            ));
        }
        Ok(Some(MoeConfig {
            num_experts,
            num_experts_per_tok: top_k,
            expert_intermediate_size,
            // Mixtral always renormalizes the top-k weights.
            norm_topk_prob: matches!(architecture, Architecture::Mixtral | Architecture::Afmoe)
                || file
                    .norm_topk_prob
                    .unwrap_or(architecture == Architecture::DeepseekV3),
            shared_expert_intermediate_size,
            router_score,
            sparse_layers,
            router_aux_loss_coef,
            naming: match architecture {
                Architecture::Mixtral => ExpertNaming::Mixtral,
                Architecture::Afmoe => ExpertNaming::Afmoe,
                Architecture::DeepseekV3 => ExpertNaming::Deepseek,
                _ => ExpertNaming::Qwen,
            },
            group_limit,
        }))
    }

    /// DeepSeek-V3's latent attention (`None` for the other families, where its fields are
    /// refused), with DeepseekV3Config's defaults. `q_lora_rank: null` means a plain `q_proj`.
    fn mla(
        &self,
        file: &HfConfigFile,
        source_fields: &Map<String, Value>,
        architecture: Architecture,
    ) -> Result<Option<MlaConfig>, ModelError> {
        if architecture != Architecture::DeepseekV3 {
            if let Some(field) = ["kv_lora_rank", "q_lora_rank", "qk_rope_head_dim"]
                .into_iter()
                .find(|f| source_fields.get(*f).is_some_and(|v| !v.is_null()))
            {
                return Err(self.unsupported(field, "latent attention", "deepseek_v3"));
            }
            return Ok(None);
        }
        let q_lora_rank = match source_fields.get("q_lora_rank") {
            None => Some(1536),
            Some(Value::Null) => None,
            Some(_) => Some(self.required(file.q_lora_rank, "q_lora_rank")?),
        };
        let kv_lora_rank = self.required(Some(file.kv_lora_rank.unwrap_or(512)), "kv_lora_rank")?;
        let qk_rope_head_dim = self.required(
            Some(file.qk_rope_head_dim.unwrap_or(64)),
            "qk_rope_head_dim",
        )?;
        if !qk_rope_head_dim.is_multiple_of(2) {
            return Err(self.invalid(
                "qk_rope_head_dim",
                format!("must be even for RoPE, found {qk_rope_head_dim}"),
            ));
        }
        let qk_nope_head_dim = file.qk_nope_head_dim.unwrap_or(128);
        let v_head_dim = self.required(Some(file.v_head_dim.unwrap_or(128)), "v_head_dim")?;
        Ok(Some(MlaConfig {
            q_lora_rank,
            kv_lora_rank,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            rope_interleave: file.rope_interleave.unwrap_or(true),
        }))
    }

    /// `layer_types`, validated: its length, its names, and sliding layers only where the
    /// architecture implements them (Gemma 2/3 always; SmolLM3 with `use_sliding_window`).
    fn layer_types(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
        layers: usize,
    ) -> Result<Vec<AttentionKind>, ModelError> {
        let sliding_allowed = match architecture {
            Architecture::Gemma2 | Architecture::Gemma3Text | Architecture::Afmoe => true,
            Architecture::SmolLm3 => file.use_sliding_window == Some(true),
            _ => false,
        };
        if file.use_sliding_window == Some(true) && !sliding_allowed {
            return Err(self.unsupported("use_sliding_window", "true", "false"));
        }
        if architecture == Architecture::Mixtral {
            // MixtralAttention slides every layer when `sliding_window` is set.
            return Ok(vec![
                if file.sliding_window.is_some() {
                    AttentionKind::Sliding
                } else {
                    AttentionKind::Full
                };
                layers
            ]);
        }
        let Some(names) = &file.layer_types else {
            // The class defaults: Gemma 2 alternates (layer 0 sliding), Gemma 3 has one global
            // layer in every `sliding_window_pattern` (6); SmolLM3 slides on its NoPE layers.
            let pattern = match architecture {
                Architecture::Gemma2 => 2,
                Architecture::Gemma3Text => file.sliding_window_pattern.unwrap_or(6),
                Architecture::Afmoe => file.global_attn_every_n_layers.unwrap_or(4),
                _ => return Ok(vec![AttentionKind::Full; layers]),
            };
            if pattern == 0 {
                return Err(self.invalid("sliding_window_pattern", "must be positive, found 0"));
            }
            return Ok((0..layers)
                .map(|i| {
                    if (i + 1) % pattern != 0 {
                        AttentionKind::Sliding
                    } else {
                        AttentionKind::Full
                    }
                })
                .collect());
        };
        if names.len() != layers {
            return Err(self.invalid(
                "layer_types",
                format!("has {} entries for {layers} layers", names.len()),
            ));
        }
        names
            .iter()
            .enumerate()
            .map(|(i, name)| match name.as_str() {
                "full_attention" => Ok(AttentionKind::Full),
                "sliding_attention" if sliding_allowed => Ok(AttentionKind::Sliding),
                // SmolLM3 writes sliding layers into layer_types but uses them only with
                // use_sliding_window (as transformers does).
                "sliding_attention" if architecture == Architecture::SmolLm3 => {
                    Ok(AttentionKind::Full)
                }
                other => Err(self.unsupported(
                    &format!("layer_types[{i}]"),
                    format!("{other:?}"),
                    if sliding_allowed {
                        "full_attention, sliding_attention"
                    } else {
                        "full_attention (sliding_attention needs use_sliding_window)"
                    },
                )),
            })
            .collect()
    }

    /// Which layers apply RoPE: SmolLM3's `no_rope_layers` (1 = RoPE, 0 = NoPE; by default every
    /// `no_rope_layer_interval`-th layer is NoPE); every layer elsewhere.
    fn rope_layers(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
        layers: usize,
    ) -> Result<Vec<bool>, ModelError> {
        if architecture != Architecture::SmolLm3 {
            if file.no_rope_layers.as_ref().is_some_and(|l| l.contains(&0)) {
                return Err(self.unsupported(
                    "no_rope_layers",
                    "NoPE layers",
                    "smollm3 (elsewhere every layer applies RoPE)",
                ));
            }
            return Ok(vec![true; layers]);
        }
        match &file.no_rope_layers {
            Some(flags) => {
                if flags.len() != layers {
                    return Err(self.invalid(
                        "no_rope_layers",
                        format!("has {} entries for {layers} layers", flags.len()),
                    ));
                }
                flags
                    .iter()
                    .enumerate()
                    .map(|(i, &f)| match f {
                        0 => Ok(false),
                        1 => Ok(true),
                        other => Err(self.invalid(
                            &format!("no_rope_layers[{i}]"),
                            format!("must be 0 (NoPE) or 1 (RoPE), found {other}"),
                        )),
                    })
                    .collect()
            }
            None => {
                let interval = file.no_rope_layer_interval.unwrap_or(4);
                if interval == 0 {
                    return Err(self.invalid("no_rope_layer_interval", "must be positive, found 0"));
                }
                Ok((0..layers).map(|i| (i + 1) % interval != 0).collect())
            }
        }
    }

    /// The global RoPE and, for Gemma 3, the sliding layers' own.
    fn ropes(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
        max_position_embeddings: usize,
    ) -> Result<(Rope, Option<Rope>), ModelError> {
        let default_theta = architecture.traits().default_rope_theta;
        if architecture != Architecture::Gemma3Text {
            let rope = self.rope(file, max_position_embeddings, default_theta)?;
            return Ok((rope, None));
        }
        let per_type = file
            .rope_parameters
            .as_ref()
            .filter(|p| p.other.values().any(Value::is_object));
        let Some(per_type) = per_type else {
            // 4.x style: rope_theta (+ rope_scaling) for the global layers, rope_local_base_freq.
            let rope = self.rope(file, max_position_embeddings, default_theta)?;
            let theta = file.rope_local_base_freq.unwrap_or(10_000.0);
            if !(theta > 0.0 && theta.is_finite()) {
                return Err(self.invalid(
                    "rope_local_base_freq",
                    format!("must be positive, found {theta}"),
                ));
            }
            let local = Rope {
                theta,
                scaling: RopeScaling::Default,
            };
            return Ok((rope, Some(local)));
        };
        let parse = |kind: AttentionKind, default_theta: f64| -> Result<Rope, ModelError> {
            let prefix = format!("rope_parameters.{}", kind.hf_name());
            let params = match per_type.other.get(kind.hf_name()) {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    serde_json::from_value::<HfRopeParameters>(v.clone())
                        .map_err(|e| self.invalid(&prefix, e.to_string()))?,
                ),
            };
            self.rope_from(
                &prefix,
                params.as_ref(),
                None,
                default_theta,
                file.original_max_position_embeddings,
                max_position_embeddings,
            )
        };
        let global = parse(AttentionKind::Full, default_theta)?;
        let local = parse(
            AttentionKind::Sliding,
            file.rope_local_base_freq.unwrap_or(10_000.0),
        )?;
        Ok((global, Some(local)))
    }

    fn rope(
        &self,
        file: &HfConfigFile,
        max_position_embeddings: usize,
        default_theta: f64,
    ) -> Result<Rope, ModelError> {
        // 5.x `rope_parameters` takes precedence over 4.x `rope_scaling`, as in transformers.
        let (prefix, params) = match (&file.rope_parameters, &file.rope_scaling) {
            (Some(p), _) => ("rope_parameters", Some(p)),
            (None, Some(p)) => ("rope_scaling", Some(p)),
            (None, None) => ("rope_scaling", None),
        };
        self.rope_from(
            prefix,
            params,
            file.rope_theta,
            default_theta,
            file.original_max_position_embeddings,
            max_position_embeddings,
        )
    }

    fn rope_from(
        &self,
        prefix: &str,
        params: Option<&HfRopeParameters>,
        file_theta: Option<f64>,
        default_theta: f64,
        file_original_max: Option<usize>,
        max_position_embeddings: usize,
    ) -> Result<Rope, ModelError> {
        let field = |name: &str| format!("{prefix}.{name}");
        if let Some(p) = params {
            if let Some((key, _)) = p.other.iter().find(|(_, v)| v.is_object()) {
                return Err(self.unsupported(
                    &field(key),
                    "a per-layer-type RoPE dictionary",
                    "one global RoPE",
                ));
            }
            if let Some(f) = p.partial_rotary_factor
                && f != 1.0
            {
                return Err(self.unsupported(
                    &field("partial_rotary_factor"),
                    f.to_string(),
                    "1.0",
                ));
            }
        }
        let theta = params
            .and_then(|p| p.rope_theta)
            .or(file_theta)
            .unwrap_or(default_theta);
        if !(theta > 0.0 && theta.is_finite()) {
            return Err(self.invalid("rope_theta", format!("must be positive, found {theta}")));
        }
        let Some(p) = params else {
            return Ok(Rope {
                theta,
                scaling: RopeScaling::Default,
            });
        };
        let rope_type = p
            .rope_type
            .as_deref()
            .or(p.legacy_type.as_deref())
            .unwrap_or("default");
        let factor = |required: bool| -> Result<Option<f64>, ModelError> {
            match p.factor {
                Some(f) if f > 0.0 && f.is_finite() => Ok(Some(f)),
                Some(f) => {
                    Err(self.invalid(&field("factor"), format!("must be positive, found {f}")))
                }
                None if required => Err(self.invalid(
                    &field("factor"),
                    format!("missing (required for {rope_type})"),
                )),
                None => Ok(None),
            }
        };
        let original_max = file_original_max.or(p.original_max_position_embeddings);
        let original_max = original_max.unwrap_or(max_position_embeddings);
        let need = |value: Option<f64>, name: &str| {
            value.ok_or_else(|| {
                self.invalid(&field(name), format!("missing (required for {rope_type})"))
            })
        };
        let scaling = match rope_type {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: factor(true)?.unwrap_or(1.0),
            },
            "llama3" => {
                let low_freq_factor = need(p.low_freq_factor, "low_freq_factor")?;
                let high_freq_factor = need(p.high_freq_factor, "high_freq_factor")?;
                if low_freq_factor == high_freq_factor {
                    return Err(self.invalid(
                        &field("high_freq_factor"),
                        "must differ from low_freq_factor",
                    ));
                }
                RopeScaling::Llama3 {
                    factor: factor(true)?.unwrap_or(1.0),
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: original_max,
                }
            }
            "yarn" => RopeScaling::Yarn {
                factor: factor(false)?,
                attention_factor: p.attention_factor,
                mscale: p.mscale,
                mscale_all_dim: p.mscale_all_dim,
                beta_fast: p.beta_fast,
                beta_slow: p.beta_slow,
                original_max_position_embeddings: original_max,
                truncate: p.truncate,
            },
            other => {
                return Err(self.unsupported(
                    &field("rope_type"),
                    format!("{other:?}"),
                    SUPPORTED_ROPE_TYPES,
                ));
            }
        };
        Ok(Rope { theta, scaling })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_json_str(json, Path::new("config.json"))
    }

    const BASE: &str = r#""vocab_size": 10, "hidden_size": 32, "intermediate_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 4"#;

    #[test]
    fn architecture_implies_biases_norms_and_defaults() {
        let qwen2 = parse(&format!(
            r#"{{"architectures": ["Qwen2ForCausalLM"], {BASE}}}"#
        ))
        .expect("qwen2");
        assert!(qwen2.attention_bias && !qwen2.attention_output_bias && !qwen2.qk_norm);
        assert_eq!((qwen2.head_dim, qwen2.num_key_value_heads), (8, 4));
        let qwen3 = parse(&format!(r#"{{"model_type": "qwen3", {BASE}}}"#)).expect("qwen3");
        assert!(qwen3.qk_norm && !qwen3.attention_bias);
        assert_eq!(qwen3.head_dim, 128, "Qwen3Config's head_dim default");
        let llama = parse(&format!(
            r#"{{"model_type": "llama", "attention_bias": true, {BASE}}}"#
        ))
        .expect("llama");
        assert!(llama.attention_bias && llama.attention_output_bias);
        assert_eq!(
            llama.rope,
            Rope {
                theta: 10_000.0,
                scaling: RopeScaling::Default
            }
        );
    }

    #[test]
    fn legacy_type_spelling_and_eos_lists_are_read() {
        let c = parse(&format!(
            r#"{{"model_type": "llama", {BASE}, "rope_theta": 50.0,
                "rope_scaling": {{"type": "linear", "factor": 2.0}}, "eos_token_id": [5, 7], "bos_token_id": null}}"#
        ))
        .expect("config");
        assert_eq!(
            c.rope,
            Rope {
                theta: 50.0,
                scaling: RopeScaling::Linear { factor: 2.0 }
            }
        );
        assert_eq!(
            (c.eos_token_ids.clone(), c.bos_token_id),
            (vec![5, 7], None)
        );
    }

    #[test]
    fn contradictions_and_unmodelled_settings_are_rejected_by_name() {
        let cases = [
            (
                r#""architectures": ["LlamaForCausalLM"], "model_type": "qwen2""#,
                "model_type",
            ),
            (
                r#""model_type": "llama", "hidden_act": "gelu_fast""#,
                "hidden_act",
            ),
            (
                r#""model_type": "qwen2", "use_sliding_window": true"#,
                "use_sliding_window",
            ),
            (
                r#""model_type": "llama", "num_key_value_heads": 3"#,
                "num_key_value_heads",
            ),
            (
                r#""model_type": "llama", "rope_parameters": {"full_attention": {"rope_type": "default"}}"#,
                "rope_parameters.full_attention",
            ),
            (
                r#""model_type": "llama", "rope_scaling": {"rope_type": "linear"}"#,
                "rope_scaling.factor",
            ),
        ];
        for (fields, field) in cases {
            let err = parse(&format!("{{{fields}, {BASE}}}"))
                .expect_err(fields)
                .to_string();
            assert!(
                err.contains("config.json") && err.contains(field),
                "{fields}: {err}"
            );
        }
    }

    #[test]
    fn hf_json_round_trips_through_the_parser() {
        let c = parse(&format!(
            r#"{{"model_type": "qwen3", {BASE}, "head_dim": 16, "tie_word_embeddings": true, "pad_token_id": 3,
                "rope_parameters": {{"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "mscale": 1.0}}}}"#
        ))
        .expect("config");
        let json = c.to_hf_json();
        assert_eq!(json["pad_token_id"], 3, "unmodelled fields are preserved");
        let again = parse(&json.to_string()).expect("reparse");
        assert_eq!(
            (
                again.rope.clone(),
                again.head_dim,
                again.tie_word_embeddings
            ),
            (c.rope.clone(), 16, true)
        );
    }

    #[test]
    fn gemma_and_smollm3_defaults_follow_the_transformers_classes() {
        let gemma2 = parse(&format!(r#"{{"model_type": "gemma2", {BASE}}}"#)).expect("gemma2");
        assert_eq!(
            (gemma2.attn_logit_softcap, gemma2.final_logit_softcap),
            (Some(50.0), Some(30.0))
        );
        assert_eq!(gemma2.query_pre_attn_scalar, Some(256.0));
        assert_eq!(gemma2.hidden_act, Activation::GeluTanh);
        assert_eq!(gemma2.layer_types, vec![AttentionKind::Sliding]);
        assert_eq!(gemma2.sliding_window, Some(4096));
        assert!(gemma2.tie_word_embeddings && gemma2.sandwich_norm && gemma2.norm_unit_offset);
        assert!(!gemma2.is_plain());
        // transformers validates it as an int.
        assert!(gemma2.to_hf_json()["query_pre_attn_scalar"].is_i64());
        // An explicit null turns a cap off.
        let uncapped = parse(&format!(
            r#"{{"model_type": "gemma2", "attn_logit_softcapping": null, {BASE}}}"#
        ))
        .expect("gemma2");
        assert_eq!(uncapped.attn_logit_softcap, None);
        let gemma3 = parse(&format!(
            r#"{{"model_type": "gemma3_text", {BASE}, "num_hidden_layers": 6, "rope_theta": 1e6,
                "rope_local_base_freq": 1e4, "rope_scaling": {{"rope_type": "linear", "factor": 8.0}}}}"#
        ))
        .expect("gemma3");
        let sliding = AttentionKind::Sliding;
        assert_eq!(
            gemma3.layer_types,
            vec![
                sliding,
                sliding,
                sliding,
                sliding,
                sliding,
                AttentionKind::Full
            ]
        );
        assert_eq!(gemma3.rope.scaling, RopeScaling::Linear { factor: 8.0 });
        assert_eq!(gemma3.local_rope.as_ref().map(|r| r.theta), Some(1e4));
        assert!(gemma3.qk_norm && gemma3.attn_logit_softcap.is_none());
        let smol = parse(&format!(
            r#"{{"model_type": "smollm3", {BASE}, "num_hidden_layers": 8}}"#
        ))
        .expect("smollm3");
        assert_eq!(
            smol.rope_layers,
            vec![true, true, true, false, true, true, true, false]
        );
        assert_eq!(smol.rope.theta, 2_000_000.0);
        assert!(smol.layer_types.iter().all(|&k| k == AttentionKind::Full));
        // Every family writes what it reads back.
        for c in [gemma2, uncapped, gemma3, smol] {
            let again = parse(&c.to_hf_json().to_string()).expect("reparse");
            assert_eq!(
                ModelConfig {
                    source_fields: Map::new(),
                    ..again
                },
                ModelConfig {
                    source_fields: Map::new(),
                    ..c
                }
            );
        }
    }

    #[test]
    fn deepseek_v3_defaults_follow_the_transformers_class() {
        let c = parse(&format!(
            r#"{{{BASE}, "model_type": "deepseek_v3", "num_hidden_layers": 4, "q_lora_rank": null}}"#
        ))
        .unwrap();
        let mla = c.mla.clone().unwrap();
        assert_eq!(mla.q_lora_rank, None);
        assert_eq!(
            (
                mla.kv_lora_rank,
                mla.qk_nope_head_dim,
                mla.qk_rope_head_dim,
                mla.v_head_dim
            ),
            (512, 128, 64, 128)
        );
        assert!(mla.rope_interleave);
        assert_eq!(c.head_dim, 64);
        assert!((c.attention_scale() - 1.0 / 192f64.sqrt()).abs() < 1e-15);
        let moe = c.moe.clone().unwrap();
        assert_eq!(
            (
                moe.num_experts,
                moe.num_experts_per_tok,
                moe.expert_intermediate_size
            ),
            (256, 8, 2048)
        );
        assert_eq!(moe.sparse_layers, vec![false, false, false, true]);
        assert_eq!(moe.shared_expert_intermediate_size, Some(2048));
        assert_eq!(
            moe.group_limit,
            Some(GroupLimit {
                groups: 8,
                topk_groups: 4
            })
        );
        assert_eq!(moe.router_score, RouterScore::Sigmoid { route_scale: 2.5 });
        assert!(moe.norm_topk_prob);
        assert_eq!(moe.naming, ExpertNaming::Deepseek);
        assert_eq!(c.num_mtp_layers, 0);
        assert!(!c.is_plain());
        // An absent q_lora_rank is DeepseekV3Config's 1536; the MTP count under either name.
        let d = parse(&format!(
            r#"{{{BASE}, "model_type": "deepseek_v3", "num_mtp_layers": 1}}"#
        ))
        .unwrap();
        assert_eq!(d.mla.unwrap().q_lora_rank, Some(1536));
        assert_eq!(d.num_mtp_layers, 1);
        // YaRN with mscale_all_dim scales the scores by mscale^2 (DeepSeek-V3's 0.1 ln(40) + 1).
        let y = parse(&format!(
            r#"{{{BASE}, "model_type": "deepseek_v3", "max_position_embeddings": 163840,
                "rope_scaling": {{"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}}}}"#
        ))
        .unwrap();
        let m = 0.1 * 40f64.ln() + 1.0;
        assert!((y.attention_scale() - m * m / 192f64.sqrt()).abs() < 1e-12);
        // Saved and parsed back: the same model.
        let again = parse(&c.to_hf_json().to_string()).unwrap();
        assert!(again.same_layout(&c));
        let again = parse(&y.to_hf_json().to_string()).unwrap();
        assert!(again.same_layout(&y));
    }

    #[test]
    fn bad_variant_fields_are_rejected_by_name() {
        let cases = [
            (
                r#""model_type": "gemma2", "layer_types": ["full_attention", "full_attention"]"#,
                "layer_types",
            ),
            (
                r#""model_type": "gemma2", "layer_types": ["chunked_attention"]"#,
                "layer_types[0]",
            ),
            (
                r#""model_type": "llama", "layer_types": ["sliding_attention"]"#,
                "layer_types[0]",
            ),
            (
                r#""model_type": "gemma2", "sliding_window": null"#,
                "sliding_window",
            ),
            (
                r#""model_type": "gemma2", "sliding_window": 0"#,
                "sliding_window",
            ),
            (
                r#""model_type": "llama", "no_rope_layers": [0]"#,
                "no_rope_layers",
            ),
            (
                r#""model_type": "smollm3", "no_rope_layers": [1, 0]"#,
                "no_rope_layers",
            ),
            (
                r#""model_type": "smollm3", "no_rope_layers": [2]"#,
                "no_rope_layers[0]",
            ),
            (
                r#""model_type": "gemma3_text", "use_bidirectional_attention": true"#,
                "use_bidirectional_attention",
            ),
            (
                r#""model_type": "gemma2", "hidden_activation": "gelu_fast""#,
                "hidden_activation",
            ),
            (
                r#""model_type": "gemma2", "attn_logit_softcapping": -1.0"#,
                "attn_logit_softcapping",
            ),
            (
                r#""model_type": "gemma3_text", "rope_parameters": {"full_attention": {"rope_type": "dynamic", "factor": 2.0}}"#,
                "rope_parameters.full_attention.rope_type",
            ),
            (
                r#""model_type": "deepseek_v3", "n_routed_experts": 6, "n_group": 4"#,
                "n_group",
            ),
            (
                r#""model_type": "deepseek_v3", "n_routed_experts": 8, "n_group": 4, "topk_group": 5"#,
                "topk_group",
            ),
            (
                r#""model_type": "deepseek_v3", "n_routed_experts": 8, "n_group": 8, "topk_group": 2"#,
                "n_group",
            ),
            (
                r#""model_type": "deepseek_v3", "n_routed_experts": 8, "n_group": 4, "topk_group": 1, "num_experts_per_tok": 3, "first_k_dense_replace": 0"#,
                "num_experts_per_tok",
            ),
            (
                r#""model_type": "deepseek_v3", "num_key_value_heads": 2"#,
                "num_key_value_heads",
            ),
            (
                r#""model_type": "deepseek_v3", "qk_rope_head_dim": 7"#,
                "qk_rope_head_dim",
            ),
            (
                r#""model_type": "deepseek_v3", "routed_scaling_factor": 0.0"#,
                "routed_scaling_factor",
            ),
            (
                r#""model_type": "deepseek_v3", "num_nextn_predict_layers": 1, "num_mtp_layers": 2"#,
                "num_mtp_layers",
            ),
            (
                r#""model_type": "llama", "kv_lora_rank": 8"#,
                "kv_lora_rank",
            ),
            (
                r#""model_type": "llama", "num_nextn_predict_layers": 1"#,
                "num_nextn_predict_layers",
            ),
        ];
        for (fields, field) in cases {
            let err = parse(&format!("{{{BASE}, {fields}}}"))
                .expect_err(fields)
                .to_string();
            assert!(
                err.contains("config.json") && err.contains(field),
                "{fields}: {err}"
            );
        }
    }
}
