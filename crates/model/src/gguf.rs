//! GGUF models: load one directly (`Transformer::load` on a `.gguf` file), and export a model to
//! GGUF (`Transformer::save_gguf`) for llama.cpp.
//!
//! Loading follows transformers' GGUF loader (see `stoke_gguf::hf`): config.json from the
//! metadata, tensors renamed and dequantized to f32, llama's q/k rows un-permuted. Every tensor
//! of the file must be one the config implies (an unknown one means stoke would ignore part of
//! the model), and every tensor the config implies must be in the file.
//!
//! Export writes the same metadata llama.cpp's `convert_hf_to_gguf.py` writes for these
//! architectures, the tokenizer from the model folder's `tokenizer.json` and
//! `tokenizer_config.json`, and the weights in F32, F16, BF16 or Q8_0 (norms and other 1-D
//! tensors stay F32, as llama.cpp's converter keeps them).

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use stoke_gguf::{GgmlType, GgufFile, TensorSpec, hf};

use crate::config::{ModelConfig, RopeScaling};
use crate::error::ModelError;
use crate::rotary::RotaryTable;
use crate::transformer::{Transformer, parameter_shapes};

/// The configuration of the GGUF model at `path` (its metadata only; no tensor is read).
pub fn config_of(path: &Path) -> Result<ModelConfig, ModelError> {
    let file = GgufFile::open(path)?;
    ModelConfig::from_json_str(&hf::hf_config(&file)?.to_string(), path)
}

impl Transformer {
    /// Loads a GGUF model file (llama, qwen2, qwen3) with f32 parameters.
    pub fn load_gguf(path: &Path, device: &Device) -> Result<Transformer, ModelError> {
        let file = GgufFile::open(path)?;
        let mut config_json = hf::hf_config(&file)?;
        let architecture = hf::architecture(&file)?.to_string();
        let mut config = ModelConfig::from_json_str(&config_json.to_string(), path)?;
        if file.tensor_info(hf::ROPE_FREQS).is_some() {
            let (_, factors) = file.tensor_f32(hf::ROPE_FREQS)?;
            config.rope.scaling = llama3_from_factors(&config, &factors).ok_or_else(|| {
                ModelError::InvalidConfig {
                    path: path.to_path_buf(),
                    field: hf::ROPE_FREQS.into(),
                    message: "these per-frequency RoPE factors are not Llama 3 scaling with any \
                              usual parameters (low 1-2, high 2-8, original context 128-131072)"
                        .into(),
                }
            })?;
            config_json = config.to_hf_json();
            config = ModelConfig::from_json_str(&config_json.to_string(), path)?;
        }
        let shapes = parameter_shapes(&config);
        let expected: BTreeMap<&str, &Vec<usize>> =
            shapes.iter().map(|(n, s)| (n.as_str(), s)).collect();
        let mut tensors = BTreeMap::new();
        let mut by_hf_name = BTreeMap::new();
        for info in &file.tensors {
            if info.name == hf::ROPE_FREQS {
                continue;
            }
            if let Some((layer, proj)) = hf::expert_tensor(&info.name) {
                // [experts, out, in]: one [out, in] slice per expert.
                let (found, values) = file.tensor_f32(&info.name)?;
                let Some(moe) = config.moe.as_ref() else {
                    return Err(ModelError::UnexpectedTensor {
                        path: path.to_path_buf(),
                        tensor: info.name.clone(),
                    });
                };
                let experts = moe.num_experts;
                let names = crate::transformer::ExpertNames::of(moe.naming);
                let slot = match proj {
                    "gate_proj" => 0,
                    "up_proj" => 1,
                    _ => 2,
                };
                let expert_name =
                    |e: usize| format!("model.layers.{layer}.{}.weight", names.expert(e)[slot]);
                let first = expert_name(0);
                let Some(&per_expert) = expected.get(first.as_str()) else {
                    return Err(ModelError::UnexpectedTensor {
                        path: path.to_path_buf(),
                        tensor: info.name.clone(),
                    });
                };
                let mut want = vec![experts];
                want.extend(per_expert.iter());
                if found != want {
                    return Err(ModelError::ShapeMismatch {
                        path: path.to_path_buf(),
                        tensor: info.name.clone(),
                        expected: want,
                        found,
                    });
                }
                let size: usize = per_expert.iter().product();
                for (e, chunk) in values.chunks_exact(size).enumerate() {
                    tensors.insert(
                        expert_name(e),
                        Tensor::from_slice(chunk, per_expert.as_slice(), device)?,
                    );
                }
                continue;
            }
            // The router is `mlp.gate` in the Qwen families' naming, Mixtral's own elsewhere.
            let mapped = hf::hf_tensor_name(&info.name).map(|name| match &config.moe {
                Some(moe) if name.ends_with(".mlp.gate.weight") => {
                    let names = crate::transformer::ExpertNames::of(moe.naming);
                    name.replace("mlp.gate.weight", &names.router())
                }
                _ => name,
            });
            match mapped {
                Some(name) => {
                    by_hf_name.insert(name, info.name.clone());
                }
                None => {
                    return Err(ModelError::UnexpectedTensor {
                        path: path.to_path_buf(),
                        tensor: info.name.clone(),
                    });
                }
            }
        }
        for (name, shape) in &shapes {
            if tensors.contains_key(name) {
                continue;
            }
            let gguf_name = by_hf_name
                .remove(name)
                .ok_or_else(|| ModelError::MissingTensor {
                    path: path.to_path_buf(),
                    tensor: hf::gguf_tensor_name(name).unwrap_or_else(|| name.clone()),
                    detail: format!(" (the model's `{name}`)"),
                })?;
            let (mut found, mut values) = file.tensor_f32(&gguf_name)?;
            // Qwen2-MoE's shared-expert gate is [1, hidden] in transformers, [hidden] in GGUF.
            if name.ends_with("mlp.shared_expert_gate.weight") && found.len() == 1 {
                found.insert(0, 1);
            }
            if &found != shape {
                return Err(ModelError::ShapeMismatch {
                    path: path.to_path_buf(),
                    tensor: gguf_name,
                    expected: shape.clone(),
                    found,
                });
            }
            if let Some(heads) = hf::permuted_heads(&architecture, name, &config_json) {
                values = hf::permute_rows(&values, shape[0], heads, false).map_err(|message| {
                    ModelError::InvalidConfig {
                        path: path.to_path_buf(),
                        field: gguf_name.clone(),
                        message,
                    }
                })?;
            }
            tensors.insert(
                name.clone(),
                Tensor::from_vec(values, shape.as_slice(), device)?,
            );
        }
        if let Some((_, gguf_name)) = by_hf_name.into_iter().next() {
            return Err(ModelError::UnexpectedTensor {
                path: path.to_path_buf(),
                tensor: gguf_name,
            });
        }
        Transformer::from_tensors(config, tensors)
    }

    /// Writes the model as a GGUF file at `path`, weights in `dtype` (F32, F16, BF16 or Q8_0;
    /// 1-D tensors stay F32, and a Q8_0 matrix whose rows are not a multiple of 32 is written in
    /// F16). The tokenizer comes from `tokenizer_dir` (a Hugging Face folder with
    /// `tokenizer.json`, or the GGUF file the model was loaded from). Non-finite weights are
    /// refused, naming the tensor.
    pub fn save_gguf(
        &self,
        path: &Path,
        tokenizer_dir: &Path,
        dtype: GgmlType,
        name: &str,
    ) -> Result<(), ModelError> {
        self.refuse_inference_only("save_gguf")?;
        let file_type = dtype.file_type().ok_or_else(|| {
            ModelError::InvalidArgument(format!(
                "GGUF export writes F32, F16, BF16 or Q8_0, not {dtype}"
            ))
        })?;
        if !gguf_exportable(self.config()) {
            return Err(ModelError::InvalidArgument(format!(
                "GGUF export: {} is not supported (stoke writes the llama, qwen2 and qwen3 \
                 blocks and the Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE mixtures of experts; \
                 this model has block variants such as sliding windows, soft-caps, NoPE layers \
                 or latent attention)",
                self.config().architecture.model_type()
            )));
        }
        let config_json = self.config().to_hf_json();
        let (tokenizer, tokenizer_config) = tokenizer_sources(tokenizer_dir)?;
        let metadata =
            hf::gguf_metadata(&config_json, &tokenizer, &tokenizer_config, name, file_type)
                .map_err(|message| {
                    ModelError::InvalidArgument(format!("GGUF export: {message}"))
                })?;
        let architecture =
            hf::gguf_architecture(self.config().architecture.model_type()).unwrap_or("llama");

        // Each GGUF tensor and the model tensors it is made of: one, or every expert's slice of
        // a stacked `ffn_*_exps` tensor.
        let tensors: BTreeMap<String, Tensor> = self
            .parameters()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        let mut parts: Vec<Vec<String>> = Vec::new();
        let mut specs = Vec::new();
        let names = self
            .config()
            .moe
            .as_ref()
            .map(|m| (crate::transformer::ExpertNames::of(m.naming), m.num_experts));
        for (hf_name, tensor) in &tensors {
            let (gguf_name, sources, shape) = match &names {
                Some((names, experts)) if hf_name.contains(".experts.") => {
                    // model.layers.{l}.{block}.experts.{e}.{proj}.weight
                    let layer: usize = hf_name
                        .strip_prefix("model.layers.")
                        .and_then(|r| r.split('.').next())
                        .and_then(|l| l.parse().ok())
                        .ok_or_else(|| {
                            ModelError::InvalidArgument(format!("GGUF export: `{hf_name}`"))
                        })?;
                    let p = |s: &str| format!("model.layers.{layer}.{s}.weight");
                    let slot = (0..3).find(|&slot| p(&names.expert(0)[slot]) == *hf_name);
                    let Some(slot) = slot else {
                        // Experts 1.. travel inside expert 0's stacked tensor.
                        continue;
                    };
                    let (gguf, _) = hf::EXPERT_TENSORS[slot];
                    let sources: Vec<String> =
                        (0..*experts).map(|e| p(&names.expert(e)[slot])).collect();
                    let mut shape = vec![*experts];
                    shape.extend(tensor.dims());
                    (format!("blk.{layer}.{gguf}.weight"), sources, shape)
                }
                Some((names, _)) if hf_name.ends_with(&names.router()) => {
                    let layer = hf_name
                        .strip_prefix("model.layers.")
                        .and_then(|r| r.split('.').next())
                        .unwrap_or_default();
                    let shape = tensor.dims().to_vec();
                    (
                        format!("blk.{layer}.ffn_gate_inp.weight"),
                        vec![hf_name.clone()],
                        shape,
                    )
                }
                _ => {
                    let gguf_name = hf::gguf_tensor_name(hf_name).ok_or_else(|| {
                        ModelError::InvalidArgument(format!(
                            "GGUF export: no GGUF name for `{hf_name}`"
                        ))
                    })?;
                    // Qwen2-MoE's shared-expert gate is 1-D in GGUF.
                    let shape = if hf_name.ends_with("mlp.shared_expert_gate.weight") {
                        vec![tensor.elem_count()]
                    } else {
                        tensor.dims().to_vec()
                    };
                    (gguf_name, vec![hf_name.clone()], shape)
                }
            };
            let row = *shape.last().unwrap_or(&0);
            // Routers stay F32, as llama.cpp's converter keeps `ffn_gate_inp`: a quantized
            // router moves near-tied expert choices.
            let router = gguf_name.contains(".ffn_gate_inp");
            let tensor_type = match dtype {
                _ if shape.len() < 2 || router => GgmlType::F32,
                GgmlType::Q8_0 if row % 32 != 0 => GgmlType::F16,
                other => other,
            };
            specs.push(TensorSpec {
                name: gguf_name,
                shape,
                dtype: tensor_type,
            });
            parts.push(sources);
        }
        // Llama 3 RoPE scaling: llama.cpp reads it as a factor per frequency.
        let rope_factors = match self.config().rope.scaling {
            RopeScaling::Llama3 { .. } => {
                let scaled = RotaryTable::new(self.config());
                let mut plain = self.config().clone();
                plain.rope.scaling = RopeScaling::Default;
                let default = RotaryTable::new(&plain);
                let factors: Vec<f32> = default
                    .inv_freq()
                    .iter()
                    .zip(scaled.inv_freq())
                    .map(|(d, s)| d / s)
                    .collect();
                specs.push(TensorSpec {
                    name: hf::ROPE_FREQS.into(),
                    shape: vec![factors.len()],
                    dtype: GgmlType::F32,
                });
                Some(factors)
            }
            _ => None,
        };
        stoke_gguf::write_gguf(path, &metadata, &specs, |i| {
            if i == parts.len() {
                let factors = rope_factors.as_deref().unwrap_or_default();
                return stoke_gguf::quant::quantize(GgmlType::F32, factors);
            }
            let hf_name = &parts[i][0];
            let mut values: Vec<f32> = Vec::new();
            for source in &parts[i] {
                let part: Vec<f32> = tensors[source]
                    .to_dtype(DType::F32)
                    .and_then(|t| t.flatten_all())
                    .and_then(|t| t.to_vec1())
                    .map_err(|e| e.to_string())?;
                values.extend(part);
            }
            if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
                return Err(format!(
                    "value {} at index {bad} is not finite; refusing to export",
                    values[bad]
                ));
            }
            if specs[i].dtype == GgmlType::F16
                && let Some(big) = values
                    .iter()
                    .position(|v| v.abs() > f32::from(half::f16::MAX))
            {
                return Err(format!(
                    "value {} at index {big} is outside F16's range (65504); export in bf16 or f32",
                    values[big]
                ));
            }
            if let Some(heads) = hf::permuted_heads(architecture, hf_name, &config_json) {
                values = hf::permute_rows(&values, specs[i].shape[0], heads, true)?;
            }
            stoke_gguf::quant::quantize(specs[i].dtype, &values)
        })?;
        Ok(())
    }
}

/// Whether `save_gguf` writes this model: the plain llama/qwen2/qwen3 block, or one of the
/// mixtures of experts llama.cpp runs as stoke computes them (Mixtral without a sliding window,
/// Qwen2-MoE, Qwen3-MoE, OLMoE).
fn gguf_exportable(config: &ModelConfig) -> bool {
    use crate::config::Architecture;
    if config.is_plain() {
        return true;
    }
    let plain_but_moe = ModelConfig {
        moe: None,
        qk_norm_whole: false,
        clip_qkv: None,
        ..config.clone()
    };
    // llama.cpp's MoE architectures have no dense layers between the sparse ones.
    let all_sparse = config
        .moe
        .as_ref()
        .is_some_and(|m| m.sparse_layers.iter().all(|&s| s));
    plain_but_moe.is_plain()
        && all_sparse
        && match config.architecture {
            Architecture::Mixtral | Architecture::Qwen2Moe | Architecture::Qwen3Moe => {
                !config.qk_norm_whole && config.clip_qkv.is_none()
            }
            Architecture::Olmoe => true,
            _ => false,
        }
}

/// The Llama 3 RoPE scaling whose per-frequency factors (llama.cpp's `rope_freqs`, the default
/// frequency divided by the scaled one) are `factors`, searched over the parameter values real
/// checkpoints use: the factor is the largest entry; low_freq_factor 1 or 2, high_freq_factor 2,
/// 4 or 8, original context a power of two from 128 to 131072. `None` when none reproduces every
/// factor within 1e-5 relative.
fn llama3_from_factors(config: &ModelConfig, factors: &[f32]) -> Option<RopeScaling> {
    if factors.len() != config.head_dim / 2 || factors.iter().any(|f| !f.is_finite() || *f <= 0.0) {
        return None;
    }
    let factor = f64::from(factors.iter().fold(0f32, |m, &f| m.max(f)));
    let mut plain = config.clone();
    plain.rope.scaling = RopeScaling::Default;
    let default = RotaryTable::new(&plain);
    for low_freq_factor in [1.0, 2.0] {
        for high_freq_factor in [2.0, 4.0, 8.0] {
            for power in 7..=17 {
                let candidate = RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: 1 << power,
                };
                let mut trial = config.clone();
                trial.rope.scaling = candidate.clone();
                let scaled = RotaryTable::new(&trial);
                let fits = default
                    .inv_freq()
                    .iter()
                    .zip(scaled.inv_freq())
                    .zip(factors)
                    .all(|((d, s), f)| ((d / s) - f).abs() <= 1e-5 * f.abs());
                if fits {
                    return Some(candidate);
                }
            }
        }
    }
    None
}

/// `tokenizer.json` and `tokenizer_config.json` of a model folder, or of a GGUF file.
fn tokenizer_sources(source: &Path) -> Result<(serde_json::Value, serde_json::Value), ModelError> {
    if stoke_gguf::is_gguf(source) {
        let file = GgufFile::open(source)?;
        let (tokenizer, config) = hf::tokenizer_files(&file)?;
        return Ok((tokenizer, serde_json::Value::Object(config)));
    }
    let read = |name: &str, required: bool| -> Result<serde_json::Value, ModelError> {
        let path = source.join(name);
        if !path.is_file() {
            return if required {
                Err(ModelError::MissingFile {
                    path,
                    hint: " (a GGUF export needs the model's tokenizer)".into(),
                })
            } else {
                Ok(serde_json::Value::Object(serde_json::Map::new()))
            };
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Io {
            path: path.clone(),
            source: e,
        })?;
        serde_json::from_str(&text).map_err(|e| ModelError::MalformedJson {
            path,
            field: format!("line {}", e.line()),
            message: e.to_string(),
        })
    };
    let tokenizer = read("tokenizer.json", true)?;
    let mut config = read("tokenizer_config.json", false)?;
    // transformers 5 may keep the default template in chat_template.jinja instead.
    let jinja = source.join("chat_template.jinja");
    if jinja.is_file()
        && let serde_json::Value::Object(map) = &mut config
    {
        let text = std::fs::read_to_string(&jinja).map_err(|e| ModelError::Io {
            path: jinja.clone(),
            source: e,
        })?;
        map.insert("chat_template".into(), serde_json::Value::String(text));
    }
    Ok((tokenizer, config))
}

/// Writes `tokenizer.json` and `tokenizer_config.json` built from a GGUF file's metadata into
/// `dir` (used when a model loaded from GGUF is saved in the Hugging Face layout).
pub(crate) fn write_tokenizer_files(gguf: &Path, dir: &Path) -> Result<(), ModelError> {
    let (tokenizer, config) = tokenizer_sources(gguf)?;
    for (name, value) in [
        ("tokenizer.json", tokenizer),
        ("tokenizer_config.json", config),
    ] {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(&value)
            .map_err(|e| ModelError::io(&path, std::io::Error::other(e)))?;
        std::fs::write(&path, text + "\n").map_err(|e| ModelError::io(&path, e))?;
    }
    Ok(())
}
