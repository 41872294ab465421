//! LoRA adapters (Hu et al. 2021) on the transformer's linear layers, in PEFT's layout; the
//! configuration is `crate::lora::LoraConfig`. On `Transformer`:
//! - `add_lora`: freezes every base parameter (the layers read detached views, so no gradient
//!   is computed or stored for them) and gives each targeted linear layer `y += s * x A^T B^T`
//!   with A `[r, in]` ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming-uniform default) and B `[out, r]`
//!   zero, so the adapted model starts equal to the base, bit for bit;
//! - `trainable_parameters`: the adapters (what the optimizer gets);
//! - `without_adapters`: the base model sharing the same weight storage (a reference model at
//!   no extra memory);
//! - `merged`: a plain model with `W + s B A` folded in (`stoke merge`);
//! - `save_adapter` / `load_adapter`: `adapter_model.safetensors` + `adapter_config.json` as PEFT
//!   writes them (`base_model.model.<module>.lora_A.weight`), loadable by `peft`.
//!
//! What it is not: LoRA on the embeddings or the LM head, DoRA, or dropout on the adapter input.
//!
//! Invariants: attaching is all or nothing (on an error the model is unchanged); adapters are
//! named by PEFT's names and only the block linear layers of `DecoderLayer::named_linears` get
//! them; a model has at most one set of adapters.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Tensor, Var};
use rand::{Rng, SeedableRng};

use super::linear::LoraAdapter;
use super::model::Transformer;
use crate::error::ModelError;
use crate::lora::LoraConfig;

const ADAPTER_FILE: &str = "adapter_model.safetensors";
const CONFIG_FILE: &str = "adapter_config.json";

fn peft_name(layer: usize, module: &str, which: &str) -> String {
    format!("base_model.model.model.layers.{layer}.{module}.lora_{which}.weight")
}

impl Transformer {
    /// Adds zero-effect LoRA adapters (B = 0) to the targeted linear layers and freezes the base;
    /// `seed` draws A. Fails if the model already has adapters.
    pub fn add_lora(&mut self, config: &LoraConfig, seed: u64) -> Result<(), ModelError> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        self.attach(config, |name, shape| {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = if name.contains(".lora_A.") {
                let bound = 1.0 / (shape[1] as f64).sqrt();
                (0..n)
                    .map(|_| rng.random_range(-bound..bound) as f32)
                    .collect()
            } else {
                vec![0.0; n]
            };
            Ok(values)
        })
    }

    /// Builds adapters from `values(name, shape)` (PEFT names) and freezes the base. All or
    /// nothing: on an error the model is unchanged.
    pub(crate) fn attach(
        &mut self,
        config: &LoraConfig,
        values: impl FnMut(&str, &[usize]) -> Result<Vec<f32>, ModelError>,
    ) -> Result<(), ModelError> {
        let next = self.with_adapters(config, values)?;
        *self = next;
        Ok(())
    }

    fn with_adapters(
        &self,
        config: &LoraConfig,
        mut values: impl FnMut(&str, &[usize]) -> Result<Vec<f32>, ModelError>,
    ) -> Result<Transformer, ModelError> {
        config.validate()?;
        if self.lora.is_some() {
            return Err(ModelError::InvalidArgument(
                "the model already has LoRA adapters".into(),
            ));
        }
        if self.dtype() != DType::F32 {
            return Err(ModelError::InvalidArgument(format!(
                "LoRA needs f32 parameters, the model has {:?}",
                self.dtype()
            )));
        }
        let device = self.device().clone();
        let scale = config.scale();
        let mut adapters = BTreeMap::new();
        let mut next = self.clone();
        next.freeze_base();
        for (layer, block) in next.layers.iter_mut().enumerate() {
            for (module, linear) in block.named_linears_mut() {
                let module = module.as_str();
                if !config.targets(&format!("model.layers.{layer}.{module}")) {
                    continue;
                }
                let (out, input) = linear.weight.dims2()?;
                let mut var = |which: &str, shape: [usize; 2]| -> Result<Var, ModelError> {
                    let name = peft_name(layer, module, which);
                    let data = values(&name, &shape)?;
                    let var = Var::from_vec(data, shape.as_slice(), &device)?;
                    adapters.insert(name, var.clone());
                    Ok(var)
                };
                let a = var("A", [config.r, input])?;
                let b = var("B", [out, config.r])?;
                linear.lora = Some(LoraAdapter {
                    a: a.as_tensor().clone(),
                    b: b.as_tensor().clone(),
                    scale,
                });
            }
        }
        if adapters.is_empty() {
            return Err(ModelError::InvalidArgument(format!(
                "lora.target_modules {:?} match no linear layer of the model",
                config.target_modules
            )));
        }
        next.lora = Some((config.clone(), adapters));
        Ok(next)
    }

    /// The LoRA config, when the model has adapters.
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora.as_ref().map(|(config, _)| config)
    }

    /// What an optimizer trains: the adapters under LoRA (PEFT names), else every parameter.
    pub fn trainable_parameters(&self) -> Vec<(String, Var)> {
        match &self.lora {
            Some((_, adapters)) => adapters
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
            None => self.parameters(),
        }
    }

    /// The base model without its adapters, sharing the same (frozen) weight storage: the
    /// reference policy of LoRA training at no extra memory.
    pub fn without_adapters(&self) -> Transformer {
        let mut base = self.clone();
        for linear in base.linears_mut() {
            linear.lora = None;
        }
        base.lora = None;
        base
    }

    /// A plain model with every adapter folded into its weight, `W + scale * B A`, computed in
    /// f64 and rounded once (new variables; this model is unchanged).
    pub fn merged(&self) -> Result<Transformer, ModelError> {
        // One new variable per tensor, made as it is needed (a merged layer's f64 temporaries
        // and f32 result live only while its variable is made): the merge holds one copy of the
        // model, not two (at 1B shapes the second copy made the end-of-run save run out of
        // memory).
        let mut adapted = BTreeMap::new();
        for (layer, block) in self.layers.iter().enumerate() {
            for (module, linear) in block.named_linears() {
                if let Some(lora) = &linear.lora {
                    adapted.insert(format!("model.layers.{layer}.{module}.weight"), lora);
                }
            }
        }
        let mut parameters = BTreeMap::new();
        for (name, var) in self.parameters() {
            let merged = match adapted.get(&name) {
                Some(lora) => {
                    let base = var.as_tensor().to_dtype(DType::F64)?;
                    let delta = lora
                        .b
                        .to_dtype(DType::F64)?
                        .matmul(&lora.a.to_dtype(DType::F64)?)?;
                    Var::from_tensor(
                        &(base + delta.affine(lora.scale, 0.0)?)?.to_dtype(DType::F32)?,
                    )?
                }
                None => Var::from_tensor(&var.as_tensor().detach())?,
            };
            parameters.insert(name, merged);
        }
        Ok(
            Transformer::assemble(self.config().clone(), parameters, &BTreeMap::new())
                .with_precision(self.precision()),
        )
    }

    /// Writes the adapters as PEFT does: `adapter_model.safetensors` (f32) and
    /// `adapter_config.json`; `base_model` goes into `base_model_name_or_path`.
    pub fn save_adapter(&self, dir: &Path, base_model: &str) -> Result<(), ModelError> {
        let Some((config, adapters)) = &self.lora else {
            return Err(ModelError::InvalidArgument(
                "the model has no LoRA adapters to save".into(),
            ));
        };
        std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let tensors: std::collections::HashMap<String, Tensor> = adapters
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        let path = dir.join(ADAPTER_FILE);
        candle_core::safetensors::save(&tensors, &path)?;
        let modules: Vec<String> = config.target_modules.clone();
        let json = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model,
            "r": config.r,
            "lora_alpha": config.lora_alpha,
            "lora_dropout": config.lora_dropout,
            "target_modules": modules,
            "use_rslora": config.use_rslora,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "modules_to_save": null,
            "use_dora": false,
        });
        let path = dir.join(CONFIG_FILE);
        let text = serde_json::to_string_pretty(&json).map_err(|e| {
            ModelError::InvalidArgument(format!("{}: cannot encode: {e}", path.display()))
        })?;
        std::fs::write(&path, text).map_err(|source| ModelError::Io { path, source })
    }

    /// Loads adapters saved by `save_adapter` or by `peft` (LoRA on this model's block linear
    /// layers, no bias, no DoRA) and attaches them; errors name the file and field or tensor.
    pub fn load_adapter(&mut self, dir: &Path) -> Result<(), ModelError> {
        let config_path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path).map_err(|source| ModelError::Io {
            path: config_path.clone(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::MalformedJson {
                path: config_path.clone(),
                field: format!("line {}", e.line()),
                message: e.to_string(),
            })?;
        let invalid = |field: &str, message: String| ModelError::InvalidConfig {
            path: config_path.clone(),
            field: field.to_string(),
            message,
        };
        if json["peft_type"] != "LORA" {
            return Err(invalid(
                "peft_type",
                format!("{} is not \"LORA\"", json["peft_type"]),
            ));
        }
        for (field, allowed) in [("bias", "none"), ("use_dora", "false")] {
            let value = &json[field];
            if !(value.is_null() || value.to_string().trim_matches('"') == allowed) {
                return Err(invalid(
                    field,
                    format!("{value} is not supported (only {allowed})"),
                ));
            }
        }
        if json["fan_in_fan_out"] == true {
            return Err(invalid("fan_in_fan_out", "true is not supported".into()));
        }
        // PEFT features that change which modules are adapted or how: refused, not ignored.
        for field in [
            "layers_to_transform",
            "exclude_modules",
            "target_parameters",
            "modules_to_save",
            "trainable_token_indices",
        ] {
            if !json[field].is_null() {
                return Err(invalid(field, format!("{} is not supported", json[field])));
            }
        }
        for field in ["rank_pattern", "alpha_pattern"] {
            let value = &json[field];
            if !(value.is_null() || value.as_object().is_some_and(|m| m.is_empty())) {
                return Err(invalid(
                    field,
                    format!("{value} is not supported (one rank and alpha)"),
                ));
            }
        }
        if json["lora_bias"] == true {
            return Err(invalid("lora_bias", "true is not supported".into()));
        }
        let targets = match &json["target_modules"] {
            serde_json::Value::String(s) => vec![s.clone()],
            serde_json::Value::Array(items) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| invalid("target_modules", format!("{v} is not a string")))
                })
                .collect::<Result<_, _>>()?,
            other => return Err(invalid("target_modules", format!("{other} is not a list"))),
        };
        let config = LoraConfig {
            r: json["r"]
                .as_u64()
                .ok_or_else(|| invalid("r", format!("{} is not a positive integer", json["r"])))?
                as usize,
            lora_alpha: json["lora_alpha"].as_f64().ok_or_else(|| {
                invalid(
                    "lora_alpha",
                    format!("{} is not a number", json["lora_alpha"]),
                )
            })?,
            lora_dropout: json["lora_dropout"].as_f64().unwrap_or(0.0),
            target_modules: targets,
            use_rslora: json["use_rslora"].as_bool().unwrap_or(false),
        };
        // Inference with adapters does not need dropout: it only acts during training.
        let config = LoraConfig {
            lora_dropout: 0.0,
            ..config
        };
        let tensors_path = dir.join(ADAPTER_FILE);
        let device = self.device().clone();
        let mut tensors = candle_core::safetensors::load(&tensors_path, &device).map_err(|e| {
            ModelError::CorruptSafetensors {
                path: tensors_path.clone(),
                message: e.to_string(),
            }
        })?;
        // PEFT may save the adapter name inside the key (`lora_A.default.weight`).
        let keys: Vec<String> = tensors.keys().cloned().collect();
        for key in keys {
            if let Some(stripped) = key.strip_suffix(".default.weight")
                && let Some(t) = tensors.remove(&key)
            {
                tensors.insert(format!("{stripped}.weight"), t);
            }
        }
        let mut seen = 0usize;
        let next = self.with_adapters(&config, |name, shape| {
            let t = tensors.get(name).ok_or_else(|| ModelError::MissingTensor {
                path: tensors_path.clone(),
                tensor: name.to_string(),
                detail: String::new(),
            })?;
            if t.dims() != shape {
                return Err(ModelError::ShapeMismatch {
                    path: tensors_path.clone(),
                    tensor: name.to_string(),
                    expected: shape.to_vec(),
                    found: t.dims().to_vec(),
                });
            }
            seen += 1;
            Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
        })?;
        if seen != tensors.len() {
            let extra = tensors
                .keys()
                .find(|k| next.lora.as_ref().is_some_and(|(_, a)| !a.contains_key(*k)))
                .cloned()
                .unwrap_or_default();
            return Err(ModelError::InvalidConfig {
                path: tensors_path,
                field: extra,
                message: "is not an adapter of a targeted module of this model".into(),
            });
        }
        *self = next;
        Ok(())
    }
}
