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
//!
//! Layout: `architecture` (the family table), `model_config` (`ModelConfig` and the types it is
//! made of, with the queries derived from them), `rope` (RoPE and its scaling, and their HF JSON
//! form), `hf_json` (the file's serde mirror, and `to_hf_json` back), `validate` (file ->
//! `ModelConfig`; `validate/moe.rs` and `validate/rope.rs` for the experts and RoPE). This file
//! holds the entry points and re-exports the public types. The submodules import each other
//! without cycles: the types (`architecture`, `rope`, `model_config`) import no parsing code.

mod architecture;
mod hf_json;
mod model_config;
mod rope;
mod validate;

pub use architecture::Architecture;
pub use model_config::{
    Activation, AttentionKind, ExpertNaming, GroupLimit, MlaConfig, ModelConfig, MoeConfig,
    RouterScore, ScoreKind,
};
pub use rope::{Rope, RopeScaling};

use crate::error::ModelError;
use hf_json::HfConfigFile;
use serde_json::Value;
use std::path::Path;
use validate::Validator;

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

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

    #[test]
    fn token_classifiers_read_their_labels_and_bias_and_write_them_back() {
        let prm = parse(&format!(
            r#"{{"architectures": ["Qwen2ForTokenClassification"], "num_labels": 2, {BASE}}}"#
        ))
        .expect("token classifier");
        assert_eq!(prm.score_labels, Some(2));
        assert_eq!(prm.score_kind, ScoreKind::Token { bias: true });
        let names: Vec<String> = crate::hf_names::parameter_shapes(&prm)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert!(names.contains(&"score.bias".to_string()));
        assert!(!names.contains(&"lm_head.weight".to_string()));

        let unbiased = parse(&format!(
            r#"{{"architectures": ["LlamaForTokenClassification"], "token_classification_bias": false,
                 "id2label": {{"0": "bad", "1": "good"}}, {BASE}}}"#
        ))
        .expect("token classifier without bias");
        assert_eq!(unbiased.score_labels, Some(2), "labels from id2label");
        assert_eq!(unbiased.score_kind, ScoreKind::Token { bias: false });
        assert!(
            !crate::hf_names::parameter_shapes(&unbiased)
                .iter()
                .any(|(n, _)| n == "score.bias")
        );
        let written = unbiased.to_hf_json();
        assert_eq!(
            written["architectures"],
            serde_json::json!(["LlamaForTokenClassification"])
        );
        assert_eq!(written["token_classification_bias"], false);
        let again = parse(&written.to_string()).expect("reparse");
        assert_eq!(again.score_kind, ScoreKind::Token { bias: false });

        let err = parse(&format!(
            r#"{{"architectures": ["LlamaForTokenClassification"], "token_classification_bias": 1, {BASE}}}"#
        ))
        .expect_err("a non-boolean bias flag")
        .to_string();
        assert!(err.contains("token_classification_bias"), "{err}");
        let sequence = parse(&format!(
            r#"{{"architectures": ["LlamaForSequenceClassification"], "num_labels": 1, {BASE}}}"#
        ))
        .expect("sequence classifier");
        assert_eq!(sequence.score_kind, ScoreKind::Sequence);
    }
}
