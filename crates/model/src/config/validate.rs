//! Validation: an `HfConfigFile` (as read) -> a `ModelConfig`, with transformers' defaults
//! for absent fields and an error naming the file and the field for everything refused.
//!
//! What is refused, never ignored: an architecture or `model_type` we do not implement, a
//! contradiction between fields, and settings that would change the computation without us
//! honouring them (an activation we do not implement, sliding windows or NoPE layers where the
//! family has none, `partial_rotary_factor` != 1, bidirectional attention, clamps, latent
//! attention or MTP layers outside their families). The experts and RoPE are validated in
//! `validate/moe.rs` and `validate/rope.rs`.
//!
//! What it is not: the JSON mirror (`hf_json`) or the family table (`architecture`).
//!
//! Invariants: every error is `InvalidConfig` or `Unsupported` with the file's path and the
//! field's name (`layer_types[3]`, `rope_scaling.factor`); a returned `ModelConfig` satisfies
//! what the model assumes (positive sizes, heads divisible by key/value heads, even head_dim).

mod moe;
mod rope;

use super::architecture::{
    Architecture, ArchitectureTraits, SUPPORTED_ARCHITECTURES, SUPPORTED_MODEL_TYPES,
};
use super::hf_json::{HfConfigFile, OneOrMany};
use super::model_config::{Activation, AttentionKind, MlaConfig, ModelConfig, ScoreKind};
use crate::error::ModelError;
use serde_json::{Map, Value};
use std::path::Path;

const SUPPORTED_ACTIVATIONS: &str = "silu, gelu_pytorch_tanh, gelu_new, gelu, relu2";

/// Carries the file path into every error.
pub(super) struct Validator<'a> {
    pub(super) path: &'a Path,
}

/// The class-name suffix of a sequence classifier (a reward model's head).
pub(super) const CLASSIFIER_SUFFIX: &str = "ForSequenceClassification";

/// The class-name suffix of a token classifier (a process reward model's head).
pub(super) const TOKEN_CLASSIFIER_SUFFIX: &str = "ForTokenClassification";

/// The classifier kind a class name's suffix names, with the class body (`Llama`), if any.
fn classifier_class(name: &str) -> Option<(&str, ScoreKind)> {
    if let Some(body) = name.strip_suffix(CLASSIFIER_SUFFIX) {
        return Some((body, ScoreKind::Sequence));
    }
    name.strip_suffix(TOKEN_CLASSIFIER_SUFFIX)
        .map(|body| (body, ScoreKind::Token { bias: true }))
}

/// The causal-LM class of a class name: `LlamaForSequenceClassification` and
/// `LlamaForTokenClassification` -> `LlamaForCausalLM` (the same body); any other name as it is.
pub(super) fn causal_class(name: &str) -> String {
    match classifier_class(name) {
        Some((body, _)) => format!("{body}ForCausalLM"),
        None => name.to_string(),
    }
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
            Some([one]) => Some(Architecture::from_hf_class(&causal_class(one)).ok_or_else(
                || self.unsupported("architectures", format!("{one:?}"), SUPPORTED_ARCHITECTURES),
            )?),
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

    /// `Some(labels)` and the head's kind for a `*ForSequenceClassification` or
    /// `*ForTokenClassification` class: `num_labels`, else the size of `id2label`, else
    /// transformers' default of 2; a token classifier's bias unless `token_classification_bias`
    /// is false.
    fn score_head(
        &self,
        file: &HfConfigFile,
        source_fields: &Map<String, Value>,
    ) -> Result<(Option<usize>, ScoreKind), ModelError> {
        let kind = file
            .architectures
            .as_deref()
            .and_then(|classes| classes.iter().find_map(|c| classifier_class(c)))
            .map(|(_, kind)| kind);
        let kind = match kind {
            None => return Ok((None, ScoreKind::Sequence)),
            Some(ScoreKind::Token { .. }) => match source_fields.get("token_classification_bias") {
                None | Some(Value::Null) => ScoreKind::Token { bias: true },
                Some(Value::Bool(bias)) => ScoreKind::Token { bias: *bias },
                Some(other) => {
                    return Err(self.invalid(
                        "token_classification_bias",
                        format!("must be true or false, found {other}"),
                    ));
                }
            },
            Some(kind) => kind,
        };
        let labels = match (
            source_fields.get("num_labels"),
            source_fields.get("id2label"),
        ) {
            (Some(n), _) => n.as_u64().map(|n| n as usize),
            (None, Some(Value::Object(labels))) => Some(labels.len()),
            (None, Some(_)) => None,
            (None, None) => Some(2),
        };
        match labels {
            Some(n) if n > 0 => Ok((Some(n), kind)),
            _ => Err(self.invalid(
                "num_labels",
                "a classifier needs at least one label (`num_labels` or `id2label`)",
            )),
        }
    }

    pub(super) fn validate(
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
        let head_dim = self.head_dim(
            &file,
            &traits,
            mla.as_ref(),
            hidden_size,
            num_attention_heads,
        )?;
        let rms_norm_eps = file.rms_norm_eps.unwrap_or(1e-6);
        if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
            return Err(self.invalid(
                "rms_norm_eps",
                format!("must be positive, found {rms_norm_eps}"),
            ));
        }
        let hidden_act = self.activation(&file, &traits)?;
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
        let gemma_default = |key: &str, given: Option<f64>, default: Option<f64>| {
            self.gemma_default(&source_fields, traits.gemma, key, given, default)
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
        let sliding_window =
            self.sliding_window(&file, &source_fields, architecture, &traits, &layer_types)?;
        let (attention_bias, attention_output_bias) =
            attention_biases(&file, architecture, &traits);
        let clip_qkv = self.clip_qkv(&file, architecture)?;
        let moe = self.moe(&file, architecture, num_hidden_layers, intermediate_size)?;
        let num_mtp_layers = self.mtp_layers(&file, architecture)?;
        let mlp_bias = matches!(architecture, Architecture::Llama | Architecture::SmolLm3)
            && file.mlp_bias.unwrap_or(false);
        let (score_labels, score_kind) = self.score_head(&file, &source_fields)?;
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
            score_labels,
            score_kind,
            clip_qkv,
            moe,
            source_fields,
        })
    }

    /// The width of a head: MLA's rotated width, else `head_dim` (the class default, or hidden
    /// size / heads); even and positive, as RoPE needs.
    fn head_dim(
        &self,
        file: &HfConfigFile,
        traits: &ArchitectureTraits,
        mla: Option<&MlaConfig>,
        hidden_size: usize,
        num_attention_heads: usize,
    ) -> Result<usize, ModelError> {
        let head_dim = match mla {
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
        Ok(head_dim)
    }

    /// The MLP's activation, from `hidden_act` or, for Gemma, `hidden_activation`.
    fn activation(
        &self,
        file: &HfConfigFile,
        traits: &ArchitectureTraits,
    ) -> Result<Activation, ModelError> {
        // Gemma names the MLP activation `hidden_activation` (hub configs often carry both).
        let (act_field, act_name) = match (&file.hidden_activation, &file.hidden_act) {
            (Some(a), _) if traits.gemma => ("hidden_activation", a.as_str()),
            (_, Some(a)) => ("hidden_act", a.as_str()),
            _ if traits.gemma => ("hidden_activation", "gelu_pytorch_tanh"),
            _ => ("hidden_act", "silu"),
        };
        Activation::from_hf_name(act_name).ok_or_else(|| {
            self.unsupported(act_field, format!("{act_name:?}"), SUPPORTED_ACTIVATIONS)
        })
    }

    /// A Gemma scalar (soft-caps, `query_pre_attn_scalar`): positive when set.
    fn gemma_default(
        &self,
        source_fields: &Map<String, Value>,
        gemma: bool,
        key: &str,
        given: Option<f64>,
        default: Option<f64>,
    ) -> Result<Option<f64>, ModelError> {
        // An absent key takes the class default; an explicit null turns the feature off.
        let value = match source_fields.contains_key(key) {
            false if gemma => default,
            _ => given,
        };
        match value {
            Some(v) if !(v > 0.0 && v.is_finite()) => {
                Err(self.invalid(key, format!("must be positive, found {v}")))
            }
            v => Ok(v),
        }
    }

    /// The sliding window (the class default when the key is absent), required and positive
    /// when a layer slides, and dropped when none does.
    fn sliding_window(
        &self,
        file: &HfConfigFile,
        source_fields: &Map<String, Value>,
        architecture: Architecture,
        traits: &ArchitectureTraits,
        layer_types: &[AttentionKind],
    ) -> Result<Option<usize>, ModelError> {
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
        Ok(sliding_window.filter(|_| layer_types.contains(&AttentionKind::Sliding)))
    }

    /// OLMoE's `clip_qkv` (positive when set); refused elsewhere.
    fn clip_qkv(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
    ) -> Result<Option<f64>, ModelError> {
        Ok(match (architecture, file.clip_qkv) {
            (Architecture::Olmoe, Some(c)) if !(c > 0.0 && c.is_finite()) => {
                return Err(self.invalid("clip_qkv", format!("must be positive, found {c}")));
            }
            (Architecture::Olmoe, c) => c,
            (_, Some(_)) => {
                return Err(self.unsupported("clip_qkv", "a clamp", "olmoe (elsewhere null)"));
            }
            (_, None) => None,
        })
    }

    /// The multi-token prediction layers (`num_nextn_predict_layers`, or its alias
    /// `num_mtp_layers`; both given must agree); DeepSeek-V3 only.
    fn mtp_layers(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
    ) -> Result<usize, ModelError> {
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
        Ok(num_mtp_layers)
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
}

/// The q/k/v and o_proj biases, `(attention_bias, attention_output_bias)`, as each family's
/// attention class decides them.
fn attention_biases(
    file: &HfConfigFile,
    architecture: Architecture,
    traits: &ArchitectureTraits,
) -> (bool, bool) {
    let attention_bias_flag = file.attention_bias.unwrap_or(false);
    match architecture {
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
    }
}
