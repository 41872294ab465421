//! Reading RoPE from a config.json: transformers 5.x `rope_parameters` (which takes
//! precedence) or 4.x `rope_theta` + `rope_scaling`, the legacy `type` spelling, and Gemma 3's
//! second RoPE for its sliding layers (`rope_local_base_freq`, or a per-layer-type dictionary).
//!
//! What it is not: the RoPE types (`config::rope`) or the frequencies (`crate::rotary`).
//!
//! Invariants: a RoPE type we do not implement, a per-layer-type dictionary outside Gemma 3 and
//! `partial_rotary_factor` != 1 are refused by name; options are kept as written (`None` when
//! absent) so that `to_hf_json` writes back what was read.

use super::Validator;
use crate::config::architecture::Architecture;
use crate::config::hf_json::{HfConfigFile, HfRopeParameters};
use crate::config::model_config::AttentionKind;
use crate::config::rope::{Rope, RopeScaling};
use crate::error::ModelError;
use serde_json::Value;

const SUPPORTED_ROPE_TYPES: &str = "default, linear, llama3, yarn";

impl Validator<'_> {
    /// The global RoPE and, for Gemma 3, the sliding layers' own.
    pub(super) fn ropes(
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
