//! The architecture table: the model families this crate implements (`Architecture`), their
//! Hugging Face class names and `model_type`s, and the structural choices and defaults each
//! implies (`ArchitectureTraits`, from transformers' config classes).
//!
//! What it is not: the parsing of a config.json (`validate`) or the runtime description
//! (`ModelConfig`); settings that a file may override are only defaults here.
//!
//! Invariants: `Architecture::ALL` lists every family once, and `traits` is the one `match`
//! where the families' structural differences are decided; the supported-name lists used in
//! error messages follow `ALL`'s order.

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
pub(super) struct ArchitectureTraits {
    pub(super) qkv_bias_forced: bool,
    pub(super) qk_norm: bool,
    pub(super) default_max_position_embeddings: usize,
    pub(super) default_head_dim: Option<usize>,
    pub(super) default_tie_word_embeddings: bool,
    pub(super) default_rope_theta: f64,
    /// The Gemma block: sandwich norms, (1 + w) norms, embeddings scaled by sqrt(hidden),
    /// `hidden_activation`, `query_pre_attn_scalar`.
    pub(super) gemma: bool,
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

    pub(super) fn traits(self) -> ArchitectureTraits {
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

    pub(super) fn from_hf_class(name: &str) -> Option<Architecture> {
        Architecture::ALL
            .into_iter()
            .find(|a| a.hf_class_name() == name)
    }

    pub(super) fn from_model_type(name: &str) -> Option<Architecture> {
        Architecture::ALL
            .into_iter()
            .find(|a| a.model_type() == name)
    }
}

pub(super) const SUPPORTED_ARCHITECTURES: &str = "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, \
     Gemma2ForCausalLM, Gemma3ForCausalLM, SmolLM3ForCausalLM, MixtralForCausalLM, \
     Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, AfmoeForCausalLM, \
     DeepseekV3ForCausalLM";
pub(super) const SUPPORTED_MODEL_TYPES: &str = "llama, qwen2, qwen3, gemma2, gemma3_text, smollm3, mixtral, \
     qwen2_moe, qwen3_moe, olmoe, afmoe, deepseek_v3";
