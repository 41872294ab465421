//! RoPE as the model runs it: the base frequency and the scaling scheme (`Rope`,
//! `RopeScaling`: default, linear, llama3, yarn), and their HF JSON form (`rope_scaling`).
//!
//! What it is not: the frequencies and cos/sin tables (`crate::rotary`) or the reading of RoPE
//! from a config.json, with its 4.x/5.x spellings and errors (`validate/rope.rs`: the reading
//! needs the validator, and these types stay below it so that no module cycle forms).
//!
//! Invariants: values are kept as the file wrote them (unresolved yarn options stay `None`),
//! so `rope_scaling_json` writes back what was read; `RopeScaling::Default` writes `null`.

use serde_json::{Map, Value};

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

/// `rope_scaling` as transformers 4.x writes it (`null` for the default RoPE).
pub(super) fn rope_scaling_json(scaling: &RopeScaling) -> Value {
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
