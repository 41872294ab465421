//! The Hugging Face name and shape table: every parameter tensor of a `ModelConfig`, named as
//! transformers' checkpoints name it, with its shape; the MLP sandwich-norm names of the family
//! and the mixture-of-experts module names (`ExpertNames`).
//!
//! What it is not: the model. No tensor is made here; `Transformer::init`, `from_tensors`,
//! `load`, `save`, GGUF import/export and `ModelConfig::num_parameters` read this table, so it
//! sits below both `config` and `transformer` (it imports `config`'s types and nothing of the
//! model, which keeps the module graph free of cycles).
//!
//! Invariants: `parameter_shapes(config)` is the single list of tensor names and shapes, sorted
//! by name; when the embeddings are tied, `lm_head.weight` is absent. The names here are the
//! ones the model's modules are built from (`Transformer::assemble`), so a rename happens in
//! one place.

use crate::config::{Architecture, ExpertNaming, MlaConfig, ModelConfig, ScoreKind};

pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";
/// A classifier's head (transformers' `*ForSequenceClassification.score` and
/// `*ForTokenClassification.score`).
pub const SCORE_HEAD: &str = "score.weight";
/// A token classifier's head bias (`*ForTokenClassification.score.bias`).
pub const SCORE_BIAS: &str = "score.bias";

/// The MLP's sandwich norms, `(pre, post)`: Gemma's `pre_feedforward_layernorm` /
/// `post_feedforward_layernorm`, AFMoE's `pre_mlp_layernorm` / `post_mlp_layernorm`.
pub(crate) fn sandwich_names(config: &ModelConfig) -> (&'static str, &'static str) {
    match config.architecture {
        Architecture::Afmoe => ("pre_mlp_layernorm", "post_mlp_layernorm"),
        _ => ("pre_feedforward_layernorm", "post_feedforward_layernorm"),
    }
}

/// Every parameter tensor of the model described by `config`: HF name and shape. When the
/// embeddings are tied, `lm_head.weight` is absent (it is `model.embed_tokens.weight`).
pub fn parameter_shapes(config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, d, i) = (
        config.hidden_size,
        config.head_dim,
        config.intermediate_size,
    );
    let q_out = config.num_attention_heads * d;
    let kv_out = config.num_key_value_heads * d;
    let mut shapes = vec![
        (EMBED_TOKENS.to_string(), vec![config.vocab_size, h]),
        (FINAL_NORM.to_string(), vec![h]),
    ];
    match config.score_labels {
        Some(labels) => {
            shapes.push((SCORE_HEAD.to_string(), vec![labels, h]));
            if config.score_kind == (ScoreKind::Token { bias: true }) {
                shapes.push((SCORE_BIAS.to_string(), vec![labels]));
            }
        }
        None if !config.tie_word_embeddings => {
            shapes.push((LM_HEAD.to_string(), vec![config.vocab_size, h]));
        }
        None => {}
    }
    for layer in 0..config.num_hidden_layers + config.num_mtp_layers {
        let p = |suffix: &str| format!("model.layers.{layer}.{suffix}");
        if layer >= config.num_hidden_layers {
            // A multi-token prediction module around its block (transformers' MtpLayer under
            // DeepSeek-V3's checkpoint names; the embedding and head are the model's).
            shapes.push((p("enorm.weight"), vec![h]));
            shapes.push((p("hnorm.weight"), vec![h]));
            shapes.push((p("eh_proj.weight"), vec![h, 2 * h]));
            shapes.push((p("shared_head.norm.weight"), vec![h]));
        }
        shapes.push((p("input_layernorm.weight"), vec![h]));
        shapes.push((p("post_attention_layernorm.weight"), vec![h]));
        if config.sandwich_norm {
            let (pre, post) = sandwich_names(config);
            shapes.push((p(&format!("{pre}.weight")), vec![h]));
            shapes.push((p(&format!("{post}.weight")), vec![h]));
        }
        if config.attn_output_gate {
            shapes.push((p("self_attn.gate_proj.weight"), vec![q_out, h]));
        }
        if let Some(mla) = &config.mla {
            latent_attention_shapes(&mut shapes, &p, config, mla);
        } else {
            for (proj, out) in [("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)] {
                shapes.push((p(&format!("self_attn.{proj}.weight")), vec![out, h]));
                if config.attention_bias {
                    shapes.push((p(&format!("self_attn.{proj}.bias")), vec![out]));
                }
            }
            shapes.push((p("self_attn.o_proj.weight"), vec![h, q_out]));
            if config.attention_output_bias {
                shapes.push((p("self_attn.o_proj.bias"), vec![h]));
            }
        }
        if config.qk_norm {
            shapes.push((p("self_attn.q_norm.weight"), vec![d]));
            shapes.push((p("self_attn.k_norm.weight"), vec![d]));
        }
        if config.qk_norm_whole {
            shapes.push((p("self_attn.q_norm.weight"), vec![q_out]));
            shapes.push((p("self_attn.k_norm.weight"), vec![kv_out]));
        }
        if let (Some(moe), true) = (&config.moe, config.is_sparse_layer(layer)) {
            let (e, ei) = (moe.num_experts, moe.expert_intermediate_size);
            let names = ExpertNames::of(moe.naming);
            shapes.push((p(&names.router()), vec![e, h]));
            if let Some(bias) = names.checkpoint_bias() {
                shapes.push((p(bias), vec![e]));
            }
            for expert in 0..e {
                let [gate, up, down] = names.expert(expert);
                shapes.push((p(&format!("{gate}.weight")), vec![ei, h]));
                shapes.push((p(&format!("{up}.weight")), vec![ei, h]));
                shapes.push((p(&format!("{down}.weight")), vec![h, ei]));
            }
            if let Some(si) = moe.shared_expert_intermediate_size {
                let (base, gate) = names.shared();
                for (proj, shape) in [
                    ("gate_proj", vec![si, h]),
                    ("up_proj", vec![si, h]),
                    ("down_proj", vec![h, si]),
                ] {
                    shapes.push((p(&format!("{base}.{proj}.weight")), shape));
                }
                if let Some(gate) = gate {
                    shapes.push((p(gate), vec![1, h]));
                }
            }
            continue;
        }
        for (proj, shape) in [
            ("gate_proj", vec![i, h]),
            ("up_proj", vec![i, h]),
            ("down_proj", vec![h, i]),
        ] {
            let out = shape[0];
            shapes.push((p(&format!("mlp.{proj}.weight")), shape));
            if config.mlp_bias {
                shapes.push((p(&format!("mlp.{proj}.bias")), vec![out]));
            }
        }
    }
    shapes.sort();
    shapes
}

/// Multi-head latent attention's tensors (DeepseekV3Attention's names); the q/kv "a"
/// projections and o_proj carry biases with `attention_bias`.
fn latent_attention_shapes(
    shapes: &mut Vec<(String, Vec<usize>)>,
    p: &dyn Fn(&str) -> String,
    config: &ModelConfig,
    mla: &MlaConfig,
) {
    let (h, heads) = (config.hidden_size, config.num_attention_heads);
    let q_out = heads * mla.qk_head_dim();
    let bias = config.attention_bias;
    let mut linear = |name: &str, out: usize, input: usize, has_bias: bool| {
        shapes.push((p(&format!("self_attn.{name}.weight")), vec![out, input]));
        if has_bias {
            shapes.push((p(&format!("self_attn.{name}.bias")), vec![out]));
        }
    };
    match mla.q_lora_rank {
        Some(rank) => {
            linear("q_a_proj", rank, h, bias);
            linear("q_b_proj", q_out, rank, false);
        }
        None => linear("q_proj", q_out, h, false),
    }
    let latent = mla.kv_lora_rank;
    linear("kv_a_proj_with_mqa", latent + mla.qk_rope_head_dim, h, bias);
    linear(
        "kv_b_proj",
        heads * (mla.qk_nope_head_dim + mla.v_head_dim),
        latent,
        false,
    );
    linear(
        "o_proj",
        h,
        heads * mla.v_head_dim,
        config.attention_output_bias,
    );
    if let Some(rank) = mla.q_lora_rank {
        shapes.push((p("self_attn.q_a_layernorm.weight"), vec![rank]));
    }
    shapes.push((p("self_attn.kv_a_layernorm.weight"), vec![latent]));
}

/// Module names of a sparse MLP within a layer (checkpoint naming of the family).
pub(crate) struct ExpertNames {
    /// `block_sparse_moe` (Mixtral) or `mlp`.
    pub(crate) block: &'static str,
    naming: ExpertNaming,
}

impl ExpertNames {
    pub(crate) fn of(naming: ExpertNaming) -> ExpertNames {
        ExpertNames {
            block: match naming {
                ExpertNaming::Mixtral => "block_sparse_moe",
                ExpertNaming::Qwen | ExpertNaming::Afmoe | ExpertNaming::Deepseek => "mlp",
            },
            naming,
        }
    }

    /// The router's weight `[experts, hidden]`.
    pub(crate) fn router(&self) -> String {
        match self.naming {
            ExpertNaming::Afmoe => "mlp.router.gate.weight".into(),
            _ => format!("{}.gate.weight", self.block),
        }
    }

    /// The shared expert's module (Qwen2-MoE `mlp.shared_expert`, AFMoE `mlp.shared_experts`)
    /// and its gate's weight, when it has one (Qwen2-MoE).
    pub(crate) fn shared(&self) -> (&'static str, Option<&'static str>) {
        match self.naming {
            ExpertNaming::Afmoe | ExpertNaming::Deepseek => ("mlp.shared_experts", None),
            _ => ("mlp.shared_expert", Some("mlp.shared_expert_gate.weight")),
        }
    }

    /// The selection bias stored in the checkpoint (AFMoE's `mlp.expert_bias`, DeepSeek-V3's
    /// `mlp.gate.e_score_correction_bias`).
    pub(crate) fn checkpoint_bias(&self) -> Option<&'static str> {
        match self.naming {
            ExpertNaming::Afmoe => Some("mlp.expert_bias"),
            ExpertNaming::Deepseek => Some("mlp.gate.e_score_correction_bias"),
            _ => None,
        }
    }

    /// Expert `e`'s gate, up and down modules.
    pub(crate) fn expert(&self, e: usize) -> [String; 3] {
        let base = format!("{}.experts.{e}", self.block);
        match self.naming {
            ExpertNaming::Mixtral => [
                format!("{base}.w1"),
                format!("{base}.w3"),
                format!("{base}.w2"),
            ],
            ExpertNaming::Qwen | ExpertNaming::Afmoe | ExpertNaming::Deepseek => [
                format!("{base}.gate_proj"),
                format!("{base}.up_proj"),
                format!("{base}.down_proj"),
            ],
        }
    }
}

impl ModelConfig {
    /// Number of scalar parameters (tied embeddings counted once).
    pub fn num_parameters(&self) -> usize {
        parameter_shapes(self)
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>())
            .sum()
    }
}
