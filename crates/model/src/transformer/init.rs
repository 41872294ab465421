//! Random initialisation of a from-scratch model: `Transformer::init` (transformers'
//! `_init_weights`: N(0, 0.02) matrices) and `init_with` an `InitScheme` (normal, truncated
//! normal, or width- and depth-scaled).
//!
//! What it is not: loading weights (`crate::checkpoint`, `crate::gguf`) or building the modules
//! (`Transformer::from_tensors`, which this ends with).
//!
//! Invariants: deterministic in the seed (one ChaCha8 stream drawn over `parameter_shapes` in
//! name order, so `init` and `init_with(InitScheme::default())` draw the same model); biases are
//! 0 and norm gains 1 in every scheme, except a sandwich's post norms (sqrt(0.5)), stored as the
//! gain minus 1 under (1 + w) norms.

use super::model::Transformer;
use crate::config::{ModelConfig, ScoreKind};
use crate::error::ModelError;
use crate::hf_names::{LM_HEAD, SCORE_BIAS, SCORE_HEAD, parameter_shapes, sandwich_names};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// Standard deviation of the random initialisation of weight matrices (HF `initializer_range`).
const INIT_STD: f64 = 0.02;

/// How `Transformer::init_with` draws the weight matrices of a from-scratch model (biases are 0
/// and norm gains 1 in every scheme, except a sandwich's post norms: sqrt(0.5)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InitScheme {
    /// N(0, std²): transformers' `_init_weights` with `initializer_range` (default 0.02).
    Normal { std: f64 },
    /// N(0, std²) cut at ±3 std (a draw outside is drawn again): OLMo 2's init, std 0.02.
    TruncatedNormal { std: f64 },
    /// Width- and depth-scaled, truncated at ±3 σ: σ = 1/sqrt(hidden_size) for every matrix, and
    /// the two projections that write into the residual stream (`o_proj`, `down_proj`) further
    /// divided by sqrt(2 · num_hidden_layers), so the residual's variance stays the same whatever
    /// the depth (GPT-2 / Megatron's output scaling on a 1/sqrt(d_model) base).
    Scaled,
}

impl Default for InitScheme {
    fn default() -> Self {
        InitScheme::Normal { std: INIT_STD }
    }
}

impl InitScheme {
    /// The standard deviation of parameter `name` and whether draws are cut at ±3 of it.
    fn std_of(self, name: &str, config: &ModelConfig) -> (f64, bool) {
        match self {
            InitScheme::Normal { std } => (std, false),
            InitScheme::TruncatedNormal { std } => (std, true),
            InitScheme::Scaled => {
                let base = 1.0 / (config.hidden_size as f64).sqrt();
                let residual_output = name.ends_with("self_attn.o_proj.weight")
                    || name.ends_with("mlp.down_proj.weight");
                if residual_output {
                    (base / (2.0 * config.num_hidden_layers as f64).sqrt(), true)
                } else {
                    (base, true)
                }
            }
        }
    }
}

impl Transformer {
    /// Random initialisation: weight matrices ~ N(0, 0.02), biases 0, norm weights 1.
    /// Deterministic in `seed` (ChaCha8 stream over the sorted parameter list).
    pub fn init(
        config: ModelConfig,
        device: &Device,
        seed: u64,
    ) -> Result<Transformer, ModelError> {
        Transformer::init_with(config, device, seed, InitScheme::default())
    }

    /// Random initialisation with `scheme` (see [`InitScheme`]); deterministic in `seed`.
    /// `InitScheme::default()` draws exactly what [`Transformer::init`] draws.
    pub fn init_with(
        config: ModelConfig,
        device: &Device,
        seed: u64,
        scheme: InitScheme,
    ) -> Result<Transformer, ModelError> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = BTreeMap::new();
        for (name, shape) in parameter_shapes(&config) {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = if name.ends_with("norm.weight") {
                // Gain 1, except the post norms of a sandwich (the outputs of attention and
                // MLP before the residual add): sqrt(0.5), so that the two branches together
                // add about the variance one pre-norm branch does. A (1 + w) norm stores the
                // gain minus 1 (transformers' Gemma init is w = 0, gain 1).
                let post = config.sandwich_norm
                    && (name.ends_with("post_attention_layernorm.weight")
                        || name.ends_with(&format!("{}.weight", sandwich_names(&config).1)));
                let gain = if post {
                    std::f32::consts::FRAC_1_SQRT_2
                } else {
                    1.0
                };
                vec![
                    if config.norm_unit_offset {
                        gain - 1.0
                    } else {
                        gain
                    };
                    n
                ]
            } else if name.ends_with(".bias") || name.ends_with("expert_bias") {
                vec![0.0; n]
            } else {
                let (std, truncated) = scheme.std_of(&name, &config);
                (0..n)
                    .map(|_| {
                        let mut z = standard_normal(&mut rng);
                        while truncated && z.abs() > 3.0 {
                            z = standard_normal(&mut rng);
                        }
                        (z * std) as f32
                    })
                    .collect()
            };
            tensors.insert(name, Tensor::from_vec(values, shape, device)?);
        }
        Transformer::from_tensors(config, tensors)
    }
}

impl Transformer {
    /// This model's body as a sequence classifier with `labels` outputs, the start of a reward
    /// model (what `AutoModelForSequenceClassification.from_pretrained(path, num_labels=labels)`
    /// makes of a causal LM): the LM head dropped, a new `score.weight` `[labels, hidden]` drawn
    /// from N(0, `initializer_range`) (the config's, else transformers' 0.02), deterministic in
    /// `seed`. The copy owns new storage; LoRA adapters are refused (merge them first).
    pub fn to_sequence_classifier(
        &self,
        labels: usize,
        seed: u64,
    ) -> Result<Transformer, ModelError> {
        self.to_classifier("to_sequence_classifier", ScoreKind::Sequence, labels, seed)
    }

    /// This model's body as a token classifier with `labels` outputs, the start of a process
    /// reward model (`AutoModelForTokenClassification.from_pretrained(path, num_labels=labels)`):
    /// as [`Transformer::to_sequence_classifier`], plus the head's bias `score.bias`, zero as
    /// transformers initialises it.
    pub fn to_token_classifier(&self, labels: usize, seed: u64) -> Result<Transformer, ModelError> {
        self.to_classifier(
            "to_token_classifier",
            ScoreKind::Token { bias: true },
            labels,
            seed,
        )
    }

    fn to_classifier(
        &self,
        what: &str,
        kind: ScoreKind,
        labels: usize,
        seed: u64,
    ) -> Result<Transformer, ModelError> {
        self.refuse_inference_only(what)?;
        if self.lora.is_some() || labels == 0 {
            return Err(ModelError::InvalidArgument(format!(
                "{what}: needs a model without adapters and at least one label ({labels} asked)"
            )));
        }
        let mut config = self.config.clone();
        config.score_labels = Some(labels);
        config.score_kind = kind;
        let std = config
            .source_fields
            .get("initializer_range")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(INIT_STD);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let hidden = config.hidden_size;
        let score: Vec<f32> = (0..labels * hidden)
            .map(|_| (standard_normal(&mut rng) * std) as f32)
            .collect();
        let mut tensors: BTreeMap<String, Tensor> = self
            .parameters
            .iter()
            .filter(|(name, _)| ![LM_HEAD, SCORE_HEAD, SCORE_BIAS].contains(&name.as_str()))
            .map(|(name, var)| (name.clone(), var.as_tensor().detach()))
            .collect();
        tensors.insert(
            SCORE_HEAD.to_string(),
            Tensor::from_vec(score, (labels, hidden), self.device())?.to_dtype(self.dtype())?,
        );
        if kind == (ScoreKind::Token { bias: true }) {
            tensors.insert(
                SCORE_BIAS.to_string(),
                Tensor::zeros(labels, self.dtype(), self.device())?,
            );
        }
        Ok(Transformer::from_tensors(config, tensors)?.with_precision(self.precision))
    }

    /// Whether this is a sequence classifier (a reward model): a `score` head applied once per
    /// sequence, no LM head.
    pub fn is_sequence_classifier(&self) -> bool {
        self.score.is_some() && self.config.score_kind == ScoreKind::Sequence
    }

    /// Whether this is a token classifier (a process reward model): a `score` head applied at
    /// every position, no LM head.
    pub fn is_token_classifier(&self) -> bool {
        self.score.is_some() && matches!(self.config.score_kind, ScoreKind::Token { .. })
    }

    /// Whether this model has a `score` head in place of the LM head (either kind of
    /// classifier): it cannot generate.
    pub fn is_classifier(&self) -> bool {
        self.score.is_some()
    }
}

/// Box-Muller transform: one N(0, 1) sample from two uniforms.
fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;
    use std::path::Path;

    fn values(var: &Var) -> Vec<f32> {
        var.as_tensor()
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("values")
    }

    fn stats(values: &[f32]) -> (f64, f64) {
        let n = values.len() as f64;
        let std = (values.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n).sqrt();
        let max = values.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
        (std, max)
    }

    #[test]
    fn init_schemes_draw_the_stated_distributions() {
        let json = r#"{
            "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 256,
            "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4,
            "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "tie_word_embeddings": true
        }"#;
        let config = ModelConfig::from_json_str(json, Path::new("<test>")).expect("config");
        let draw =
            |scheme| Transformer::init_with(config.clone(), &Device::Cpu, 7, scheme).expect("init");
        let all = |m: &Transformer| -> Vec<(String, Vec<f32>)> {
            m.parameters()
                .iter()
                .map(|(n, v)| (n.clone(), values(v)))
                .collect()
        };
        // The default scheme is `init`, draw for draw.
        let plain = Transformer::init(config.clone(), &Device::Cpu, 7).expect("init");
        assert_eq!(all(&draw(InitScheme::default())), all(&plain));
        // A standard normal cut at ±3 has standard deviation 0.98658.
        let cut = 0.98658;
        let truncated = draw(InitScheme::TruncatedNormal { std: 0.02 });
        let scaled = draw(InitScheme::Scaled);
        let base = 1.0 / 16.0;
        for (name, w) in all(&truncated) {
            if name.ends_with("norm.weight") {
                assert!(w.iter().all(|&v| v == 1.0));
                continue;
            }
            let (std, max) = stats(&w);
            assert!(max <= 3.0 * 0.02 + 1e-9, "{name}: {max} past 3 std");
            assert!((std / (0.02 * cut) - 1.0).abs() < 0.03, "{name}: std {std}");
        }
        for (name, w) in all(&scaled) {
            if name.ends_with("norm.weight") {
                continue;
            }
            let expected = if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")
            {
                base / 4.0 // sqrt(2 x 8 layers)
            } else {
                base
            };
            let (std, max) = stats(&w);
            assert!(max <= 3.0 * expected + 1e-9, "{name}: {max} past 3 std");
            assert!(
                (std / (expected * cut) - 1.0).abs() < 0.03,
                "{name}: std {std} vs {expected}"
            );
        }
        // Seeded: the same seed draws the same model.
        assert_eq!(all(&draw(InitScheme::Scaled)), all(&scaled));
    }

    #[test]
    fn sandwich_post_norms_start_at_a_gain_of_sqrt_half() {
        let moe = r#", "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8"#;
        for (model_type, offset, extra) in [("gemma2", true, ""), ("afmoe", false, moe)] {
            let json = format!(
                r#"{{"model_type": "{model_type}", "vocab_size": 37, "hidden_size": 16,
                "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 8{extra}}}"#
            );
            let config = ModelConfig::from_json_str(&json, Path::new("<test>")).expect("config");
            let model = Transformer::init(config, &Device::Cpu, 3).expect("init");
            let mut seen = 0;
            for (name, var) in model.parameters() {
                if !name.ends_with("norm.weight") {
                    continue;
                }
                let post = name.contains("post_attention_layernorm")
                    || name.contains("post_feedforward_layernorm")
                    || name.contains("post_mlp_layernorm");
                let gain = if post { 0.5f32.sqrt() } else { 1.0 };
                let stored = if offset { gain - 1.0 } else { gain };
                assert!(
                    values(&var).iter().all(|&v| (v - stored).abs() < 1e-7),
                    "{model_type}: {name}"
                );
                seen += usize::from(post);
            }
            assert_eq!(seen, 4, "{model_type}: two post norms per layer");
        }
    }
}
