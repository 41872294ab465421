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
use crate::hf_names::{ExpertNames, parameter_shapes};
use crate::rotary::RotaryTable;
use crate::transformer::Transformer;

/// The configuration of the GGUF model at `path` (its metadata only; no tensor is read).
pub fn config_of(path: &Path) -> Result<ModelConfig, ModelError> {
    let file = GgufFile::open(path)?;
    ModelConfig::from_json_str(&hf::hf_config(&file)?.to_string(), path)
}

impl Transformer {
    /// Loads a GGUF model file (llama, qwen2, qwen3, and the mixtures of experts in
    /// [`hf::MOE_ARCHITECTURES`]) with f32 parameters.
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
        // deepseek2's split kv_b_proj: layer -> (attn_k_b, attn_v_b).
        let mut kv_b_halves: BTreeMap<usize, [Option<String>; 2]> = BTreeMap::new();
        for info in &file.tensors {
            if info.name == hf::ROPE_FREQS {
                continue;
            }
            if let Some((layer, half)) = mla_half(&info.name)
                && config.mla.is_some()
            {
                kv_b_halves.entry(layer).or_default()[half] = Some(info.name.clone());
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
                let names = ExpertNames::of(moe.naming);
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
            let mapped =
                hf::hf_tensor_name(&architecture, &info.name).map(|name| match &config.moe {
                    Some(moe) if name.ends_with(".mlp.gate.weight") => {
                        let names = ExpertNames::of(moe.naming);
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
        for (layer, halves) in kv_b_halves {
            let name = format!("model.layers.{layer}.self_attn.kv_b_proj.weight");
            let kv_b = join_kv_b(&file, &config, layer, &halves)?;
            let shape = expected.get(name.as_str()).copied().ok_or_else(|| {
                ModelError::UnexpectedTensor {
                    path: path.to_path_buf(),
                    tensor: format!("blk.{layer}.{}.weight", hf::MLA_K_B),
                }
            })?;
            tensors.insert(name, Tensor::from_vec(kv_b, shape.as_slice(), device)?);
        }
        for (name, shape) in &shapes {
            if tensors.contains_key(name) {
                continue;
            }
            let gguf_name = by_hf_name
                .remove(name)
                .ok_or_else(|| ModelError::MissingTensor {
                    path: path.to_path_buf(),
                    tensor: hf::gguf_tensor_name(&architecture, name)
                        .unwrap_or_else(|| name.clone()),
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
                 blocks and the Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE and DeepSeek-V3 mixtures \
                 of experts; this model has block variants such as sliding windows, soft-caps \
                 or NoPE layers)",
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

        // Each GGUF tensor, the model tensors it is made of (one, or every expert's slice of a
        // stacked `ffn_*_exps` tensor) and how their values are rearranged.
        let tensors: BTreeMap<String, Tensor> = self
            .parameters()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        let mut parts: Vec<(Vec<String>, Rearrange)> = Vec::new();
        let mut specs = Vec::new();
        let names = self
            .config()
            .moe
            .as_ref()
            .map(|m| (ExpertNames::of(m.naming), m.num_experts));
        let kv_b = kv_b_shape(self.config());
        for (hf_name, tensor) in &tensors {
            let layer = layer_of(hf_name);
            // The multi-token prediction modules (layers past num_hidden_layers): llama.cpp's
            // deepseek2 has no place for them, and its converter leaves them out too.
            if layer.is_some_and(|l| l >= self.config().num_hidden_layers) {
                continue;
            }
            let mut rearrange =
                self.rotary_rearrange(hf_name, tensor.dims().first().copied().unwrap_or(0));
            let (gguf_name, sources, shape) = match (&names, layer, kv_b) {
                (Some((names, experts)), Some(layer), _) if hf_name.contains(".experts.") => {
                    // model.layers.{l}.{block}.experts.{e}.{proj}.weight
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
                (Some((names, _)), Some(layer), _) if hf_name.ends_with(&names.router()) => (
                    format!("blk.{layer}.ffn_gate_inp.weight"),
                    vec![hf_name.clone()],
                    tensor.dims().to_vec(),
                ),
                (_, Some(layer), Some(kv_b)) if hf_name.ends_with(".kv_b_proj.weight") => {
                    // llama.cpp's absorbed decode reads kv_b_proj as two tensors.
                    for (half, name, shape) in [
                        (0, hf::MLA_K_B, vec![kv_b.heads, kv_b.rank, kv_b.nope]),
                        (1, hf::MLA_V_B, vec![kv_b.heads, kv_b.value, kv_b.rank]),
                    ] {
                        specs.push(tensor_spec(
                            format!("blk.{layer}.{name}.weight"),
                            shape,
                            dtype,
                        ));
                        parts.push((vec![hf_name.clone()], Rearrange::KvBHalf(kv_b, half)));
                    }
                    continue;
                }
                _ => {
                    let gguf_name =
                        hf::gguf_tensor_name(architecture, hf_name).ok_or_else(|| {
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
                    if let Some(heads) = hf::permuted_heads(architecture, hf_name, &config_json) {
                        rearrange = Rearrange::Rotary {
                            rows: shape[0],
                            block: shape[0] / heads.max(1),
                            offset: 0,
                            rope: shape[0] / heads.max(1),
                        };
                    }
                    (gguf_name, vec![hf_name.clone()], shape)
                }
            };
            specs.push(tensor_spec(gguf_name, shape, dtype));
            parts.push((sources, rearrange));
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
            let (sources, rearrange) = &parts[i];
            let mut values: Vec<f32> = Vec::new();
            for source in sources {
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
            let values = rearrange.apply(values)?;
            stoke_gguf::quant::quantize(specs[i].dtype, &values)
        })?;
        Ok(())
    }
}

/// How an exported tensor's values are rearranged from the model's layout to llama.cpp's.
#[derive(Debug, Clone, Copy)]
enum Rearrange {
    AsIs,
    /// The rotary rows `offset..offset + rope` of every `block` of rows go from transformers'
    /// half-split pairs to llama.cpp's adjacent pairs.
    Rotary {
        rows: usize,
        block: usize,
        offset: usize,
        rope: usize,
    },
    /// `kv_b_proj`'s key (0) or value (1) half, as llama.cpp's deepseek2 stores it.
    KvBHalf(hf::KvB, usize),
}

impl Rearrange {
    fn apply(self, values: Vec<f32>) -> Result<Vec<f32>, String> {
        match self {
            Rearrange::AsIs => Ok(values),
            Rearrange::Rotary {
                rows,
                block,
                offset,
                rope,
            } => hf::permute_rotary_rows(&values, rows, block, offset, rope, true),
            Rearrange::KvBHalf(shape, half) => {
                let (k_b, v_b) = shape.split(&values)?;
                Ok(if half == 0 { k_b } else { v_b })
            }
        }
    }
}

/// The layer of a per-layer parameter (`model.layers.3.mlp...` -> 3).
fn layer_of(hf_name: &str) -> Option<usize> {
    hf_name
        .strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// The GGUF tensor `name` of `shape` in the export type `dtype`: 1-D tensors and routers stay
/// F32 (as llama.cpp's converter keeps `ffn_gate_inp`: a quantized router moves near-tied expert
/// choices), and a Q8_0 matrix whose rows are not a multiple of 32 is written in F16.
fn tensor_spec(name: String, shape: Vec<usize>, dtype: GgmlType) -> TensorSpec {
    let row = *shape.last().unwrap_or(&0);
    let router = name.contains(".ffn_gate_inp");
    let dtype = match dtype {
        _ if shape.len() < 2 || router => GgmlType::F32,
        GgmlType::Q8_0 if !row.is_multiple_of(32) => GgmlType::F16,
        other => other,
    };
    TensorSpec { name, shape, dtype }
}

impl Transformer {
    /// The rearrangement of parameter `hf_name`'s rows for llama.cpp's RoPE in a latent-attention
    /// model whose rotary dims are half-split (`rope_interleave = false`): llama.cpp's deepseek2
    /// rotates adjacent pairs, so the rotary rows of each query head and of the latent
    /// projection are interleaved on the way out. (The GGUF then loads back with
    /// `rope_interleave = true` and the same outputs.)
    fn rotary_rearrange(&self, hf_name: &str, rows: usize) -> Rearrange {
        let config = self.config();
        let Some(mla) = config.mla.as_ref().filter(|m| !m.rope_interleave) else {
            return Rearrange::AsIs;
        };
        let rope = mla.qk_rope_head_dim;
        if hf_name.ends_with(".self_attn.q_b_proj.weight")
            || hf_name.ends_with(".self_attn.q_proj.weight")
        {
            Rearrange::Rotary {
                rows,
                block: mla.qk_head_dim(),
                offset: mla.qk_nope_head_dim,
                rope,
            }
        } else if hf_name.ends_with(".self_attn.kv_a_proj_with_mqa.weight") {
            Rearrange::Rotary {
                rows,
                block: mla.kv_lora_rank + rope,
                offset: mla.kv_lora_rank,
                rope,
            }
        } else {
            Rearrange::AsIs
        }
    }
}

/// `(layer, 0)` for deepseek2's `blk.N.attn_k_b.weight`, `(layer, 1)` for `attn_v_b`.
fn mla_half(name: &str) -> Option<(usize, usize)> {
    let (layer, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    let half = match rest.strip_suffix(".weight")? {
        hf::MLA_K_B => 0,
        hf::MLA_V_B => 1,
        _ => return None,
    };
    Some((layer.parse().ok()?, half))
}

/// The sizes of the model's `kv_b_proj` for [`hf::KvB`].
fn kv_b_shape(config: &ModelConfig) -> Option<hf::KvB> {
    config.mla.as_ref().map(|mla| hf::KvB {
        heads: config.num_attention_heads,
        nope: mla.qk_nope_head_dim,
        value: mla.v_head_dim,
        rank: mla.kv_lora_rank,
    })
}

/// `kv_b_proj` of `layer` from its two deepseek2 halves (both must be there, each of the shape
/// the config implies).
fn join_kv_b(
    file: &GgufFile,
    config: &ModelConfig,
    layer: usize,
    halves: &[Option<String>; 2],
) -> Result<Vec<f32>, ModelError> {
    let path = file.path();
    let Some(shape) = kv_b_shape(config) else {
        return Err(ModelError::UnexpectedTensor {
            path: path.to_path_buf(),
            tensor: format!("blk.{layer}.{}.weight", hf::MLA_K_B),
        });
    };
    let mut values = Vec::new();
    let wants = [
        (hf::MLA_K_B, vec![shape.heads, shape.rank, shape.nope]),
        (hf::MLA_V_B, vec![shape.heads, shape.value, shape.rank]),
    ];
    for ((name, want), tensor) in wants.into_iter().zip(halves) {
        let tensor = tensor.as_ref().ok_or_else(|| ModelError::MissingTensor {
            path: path.to_path_buf(),
            tensor: format!("blk.{layer}.{name}.weight"),
            detail: format!(
                " (half of the model's `model.layers.{layer}.self_attn.kv_b_proj.weight`)"
            ),
        })?;
        let (found, data) = file.tensor_f32(tensor)?;
        if found != want {
            return Err(ModelError::ShapeMismatch {
                path: path.to_path_buf(),
                tensor: tensor.clone(),
                expected: want,
                found,
            });
        }
        values.push(data);
    }
    shape
        .join(&values[0], &values[1])
        .map_err(|message| ModelError::InvalidConfig {
            path: path.to_path_buf(),
            field: format!("blk.{layer}.{}.weight", hf::MLA_K_B),
            message,
        })
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
        mla: None,
        ..config.clone()
    };
    let Some(moe) = config.moe.as_ref() else {
        return false;
    };
    // llama.cpp's MoE architectures have no dense layers between the sparse ones; deepseek2 has
    // its `leading_dense_block_count` dense layers first.
    let all_sparse = moe.sparse_layers.iter().all(|&s| s);
    let dense_then_sparse = moe.sparse_layers.windows(2).all(|w| w[0] <= w[1]);
    plain_but_moe.is_plain()
        && match config.architecture {
            Architecture::Mixtral | Architecture::Qwen2Moe | Architecture::Qwen3Moe => {
                all_sparse && !config.qk_norm_whole && config.clip_qkv.is_none()
            }
            Architecture::Olmoe => all_sparse,
            // llama.cpp's deepseek2 has no attention or MLP biases.
            Architecture::DeepseekV3 => {
                dense_then_sparse
                    && config.mla.is_some()
                    && !config.qk_norm_whole
                    && !config.attention_bias
                    && !config.attention_output_bias
                    && !config.mlp_bias
            }
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
