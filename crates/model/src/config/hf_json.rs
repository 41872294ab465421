//! config.json in transformers' form: the serde mirror the file is read into (`HfConfigFile`,
//! `HfRopeParameters`: the fields that matter to the computation, each optional) and
//! `ModelConfig::to_hf_json`, which writes one back.
//!
//! What it is not: validation. The mirror accepts any value of the right JSON type and unknown
//! keys (HF configs carry dozens of irrelevant fields); `validate` decides what is accepted.
//!
//! Invariants: `to_hf_json` starts from the source file's fields and overwrites those we model,
//! so a parse -> write -> parse round trip gives an equal `ModelConfig`; RoPE is written in the
//! 4.x form (`rope_theta` + `rope_scaling`), which transformers 4.x and 5.x both read.

use super::architecture::Architecture;
use super::model_config::{AttentionKind, ExpertNaming, ModelConfig, RouterScore, ScoreKind};
use super::rope::rope_scaling_json;
use super::validate::{CLASSIFIER_SUFFIX, TOKEN_CLASSIFIER_SUFFIX};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// transformers' config.json, the fields that matter to the computation.
#[derive(Debug, Deserialize)]
pub(super) struct HfConfigFile {
    pub(super) architectures: Option<Vec<String>>,
    pub(super) model_type: Option<String>,
    pub(super) vocab_size: Option<usize>,
    pub(super) hidden_size: Option<usize>,
    pub(super) intermediate_size: Option<usize>,
    pub(super) num_hidden_layers: Option<usize>,
    pub(super) num_attention_heads: Option<usize>,
    pub(super) num_key_value_heads: Option<usize>,
    pub(super) head_dim: Option<usize>,
    pub(super) rms_norm_eps: Option<f64>,
    pub(super) rope_theta: Option<f64>,
    pub(super) rope_scaling: Option<HfRopeParameters>,
    pub(super) rope_parameters: Option<HfRopeParameters>,
    pub(super) partial_rotary_factor: Option<f64>,
    pub(super) original_max_position_embeddings: Option<usize>,
    pub(super) attention_bias: Option<bool>,
    pub(super) mlp_bias: Option<bool>,
    pub(super) tie_word_embeddings: Option<bool>,
    pub(super) max_position_embeddings: Option<usize>,
    pub(super) bos_token_id: Option<u32>,
    pub(super) eos_token_id: Option<OneOrMany>,
    pub(super) hidden_act: Option<String>,
    pub(super) hidden_activation: Option<String>,
    pub(super) use_sliding_window: Option<bool>,
    pub(super) sliding_window: Option<usize>,
    pub(super) layer_types: Option<Vec<String>>,
    pub(super) no_rope_layers: Option<Vec<u8>>,
    pub(super) no_rope_layer_interval: Option<usize>,
    pub(super) sliding_window_pattern: Option<usize>,
    pub(super) query_pre_attn_scalar: Option<f64>,
    pub(super) attn_logit_softcapping: Option<f64>,
    pub(super) final_logit_softcapping: Option<f64>,
    pub(super) rope_local_base_freq: Option<f64>,
    pub(super) use_bidirectional_attention: Option<bool>,
    pub(super) qkv_bias: Option<bool>,
    pub(super) clip_qkv: Option<f64>,
    pub(super) num_experts: Option<usize>,
    pub(super) num_local_experts: Option<usize>,
    pub(super) num_shared_experts: Option<usize>,
    pub(super) num_dense_layers: Option<usize>,
    pub(super) route_scale: Option<f64>,
    pub(super) global_attn_every_n_layers: Option<usize>,
    pub(super) mup_enabled: Option<bool>,
    pub(super) num_experts_per_tok: Option<usize>,
    pub(super) moe_intermediate_size: Option<usize>,
    pub(super) shared_expert_intermediate_size: Option<usize>,
    pub(super) norm_topk_prob: Option<bool>,
    pub(super) decoder_sparse_step: Option<usize>,
    pub(super) mlp_only_layers: Option<Vec<usize>>,
    pub(super) router_aux_loss_coef: Option<f64>,
    pub(super) q_lora_rank: Option<usize>,
    pub(super) kv_lora_rank: Option<usize>,
    pub(super) qk_nope_head_dim: Option<usize>,
    pub(super) qk_rope_head_dim: Option<usize>,
    pub(super) v_head_dim: Option<usize>,
    pub(super) rope_interleave: Option<bool>,
    pub(super) n_routed_experts: Option<usize>,
    pub(super) n_shared_experts: Option<usize>,
    pub(super) n_group: Option<usize>,
    pub(super) topk_group: Option<usize>,
    pub(super) routed_scaling_factor: Option<f64>,
    pub(super) first_k_dense_replace: Option<usize>,
    pub(super) num_nextn_predict_layers: Option<usize>,
    pub(super) num_mtp_layers: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

/// `rope_scaling` (4.x) or `rope_parameters` (5.x).
#[derive(Debug, Deserialize)]
pub(super) struct HfRopeParameters {
    pub(super) rope_type: Option<String>,
    #[serde(rename = "type")]
    pub(super) legacy_type: Option<String>,
    pub(super) rope_theta: Option<f64>,
    pub(super) factor: Option<f64>,
    pub(super) low_freq_factor: Option<f64>,
    pub(super) high_freq_factor: Option<f64>,
    pub(super) original_max_position_embeddings: Option<usize>,
    pub(super) attention_factor: Option<f64>,
    pub(super) mscale: Option<f64>,
    pub(super) mscale_all_dim: Option<f64>,
    pub(super) beta_fast: Option<f64>,
    pub(super) beta_slow: Option<f64>,
    pub(super) truncate: Option<bool>,
    pub(super) partial_rotary_factor: Option<f64>,
    #[serde(flatten)]
    pub(super) other: BTreeMap<String, Value>,
}

impl ModelConfig {
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
        match self.score_labels {
            None => set(
                "architectures",
                Value::from(vec![self.architecture.hf_class_name()]),
            ),
            Some(labels) => {
                let class = self.architecture.hf_class_name();
                let body = class.strip_suffix("ForCausalLM").unwrap_or(class);
                let suffix = match self.score_kind {
                    ScoreKind::Sequence => CLASSIFIER_SUFFIX,
                    ScoreKind::Token { bias } => {
                        if !bias {
                            set("token_classification_bias", false.into());
                        }
                        TOKEN_CLASSIFIER_SUFFIX
                    }
                };
                set(
                    "architectures",
                    Value::from(vec![format!("{body}{suffix}")]),
                );
                // transformers keeps the labels as `id2label` / `label2id` (`num_labels` is
                // derived from them).
                let names: Vec<String> = (0..labels).map(|i| format!("LABEL_{i}")).collect();
                set(
                    "id2label",
                    names
                        .iter()
                        .enumerate()
                        .map(|(i, n)| (i.to_string(), Value::from(n.as_str())))
                        .collect::<Map<String, Value>>()
                        .into(),
                );
                set(
                    "label2id",
                    names
                        .iter()
                        .enumerate()
                        .map(|(i, n)| (n.clone(), Value::from(i)))
                        .collect::<Map<String, Value>>()
                        .into(),
                );
            }
        }
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
        if self.score_labels.is_some() {
            out.remove("num_labels");
        }
        // One spelling of the MTP layer count (num_nextn_predict_layers, written above).
        out.remove("num_mtp_layers");
        Value::Object(out)
    }
}
