//! LoRA's configuration (Hu et al. 2021) in PEFT's layout: `LoraConfig` (rank, alpha, dropout,
//! target modules by Hugging Face module names, rsLoRA scaling; the fields of PEFT's
//! `adapter_config.json`), its checks, and which modules it targets.
//!
//! What it is not: the adapters. `add_lora`, `trainable_parameters`, `without_adapters`,
//! `merged` and `save_adapter` / `load_adapter` on `Transformer` are in `transformer/lora.rs`,
//! and a linear layer's adapter is `transformer::linear::LoraAdapter`; this module imports
//! nothing of the model, which imports it (so no module cycle forms). Not supported: LoRA on the
//! embeddings or the LM head, DoRA, or dropout on the adapter input (refused with a clear error
//! until it is implemented: with activation checkpointing the mask has to be reproducible).
//!
//! Invariants: scale `s = alpha / r` (`alpha / sqrt(r)` with `use_rslora`); a target matches a
//! module path it equals or ends after a dot (PEFT's rule); `target_modules` is a list of names
//! or `"all-linear"`, never a regular expression.

use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// The module names of a decoder block's linear layers, in `DecoderLayer::linears` order.
pub const LINEAR_MODULES: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// LoRA settings (PEFT's `LoraConfig` fields that stoke uses; the JSON file carries PEFT's other
/// fields with their defaults so `peft` loads it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// Rank `r` of each adapter.
    pub r: usize,
    pub lora_alpha: f64,
    #[serde(default)]
    pub lora_dropout: f64,
    /// Module names (`q_proj`, `self_attn.q_proj`, ...; a name matches a module whose path ends
    /// with it) or `["all-linear"]`; the string `"all-linear"` alone is taken as that list, as
    /// PEFT takes it.
    #[serde(deserialize_with = "names_or_all_linear")]
    pub target_modules: Vec<String>,
    #[serde(default)]
    pub use_rslora: bool,
}

/// `target_modules`: a list of names, or the string "all-linear". Other strings are refused: PEFT
/// reads a string as a regular expression over module paths, which stoke does not implement.
fn names_or_all_linear<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Targets {
        One(String),
        Many(Vec<String>),
    }
    match Targets::deserialize(d)? {
        Targets::Many(names) => Ok(names),
        Targets::One(s) if s == "all-linear" => Ok(vec![s]),
        Targets::One(s) => Err(serde::de::Error::custom(format!(
            "{s:?}: a single string must be \"all-linear\" (PEFT reads other strings as regular \
             expressions, which stoke does not); give a list of module names instead"
        ))),
    }
}

impl LoraConfig {
    /// The adapter scale `alpha / r` (`alpha / sqrt(r)` with rsLoRA).
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.lora_alpha / (self.r as f64).sqrt()
        } else {
            self.lora_alpha / self.r as f64
        }
    }

    /// Checks the ranges; errors name the field.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |field: &str, message: &str| {
            ModelError::InvalidArgument(format!("lora.{field}: {message}"))
        };
        if self.r == 0 {
            return Err(bad("r", "must be at least 1"));
        }
        if !(self.lora_alpha.is_finite() && self.lora_alpha > 0.0) {
            return Err(bad("lora_alpha", "must be a finite number > 0"));
        }
        if self.lora_dropout != 0.0 {
            return Err(bad(
                "lora_dropout",
                "only 0 is supported so far (a reproducible dropout mask under activation \
                 checkpointing is not implemented yet)",
            ));
        }
        if self.target_modules.is_empty() {
            return Err(bad("target_modules", "names no module"));
        }
        for target in &self.target_modules {
            let names_a_linear = LINEAR_MODULES
                .iter()
                .any(|m| matches(m, target) || matches(target, m));
            if target != "all-linear" && !names_a_linear {
                return Err(bad(
                    "target_modules",
                    &format!(
                        "{target:?} is not a linear layer of the model (choose from q_proj, \
                         k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj or all-linear)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether the module at `path` (e.g. `model.layers.3.self_attn.q_proj`) gets an adapter.
    pub fn targets(&self, path: &str) -> bool {
        self.target_modules
            .iter()
            .any(|t| t == "all-linear" || matches(path, t))
    }
}

/// PEFT's rule: the target equals the module path or is a suffix of it after a dot.
fn matches(module: &str, target: &str) -> bool {
    module == target || module.ends_with(&format!(".{target}"))
}

#[cfg(test)]
mod target_module_tests {
    use super::*;

    #[test]
    fn target_modules_take_a_list_or_the_all_linear_string_and_refuse_other_strings() {
        let parse = |t: &str| {
            serde_json::from_str::<LoraConfig>(&format!(
                r#"{{"r": 4, "lora_alpha": 8, "target_modules": {t}}}"#
            ))
        };
        assert_eq!(
            parse(r#""all-linear""#).unwrap().target_modules,
            vec!["all-linear"]
        );
        assert_eq!(
            parse(r#"["q_proj", "v_proj"]"#).unwrap().target_modules,
            vec!["q_proj", "v_proj"]
        );
        let err = parse(r#"".*proj""#).unwrap_err().to_string();
        assert!(err.contains("regular"), "{err}");
    }
}
