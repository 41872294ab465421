//! Hugging Face checkpoint directories: load (config.json + safetensors, single file or
//! sharded via `model.safetensors.index.json`, f32/bf16/f16 -> f32) and save (config.json,
//! model.safetensors in f32, generation_config.json, optionally the tokenizer files).
//!
//! Loading memory-maps each safetensors file and converts tensor by tensor, so peak memory is
//! the f32 model plus page cache. Every tensor the config implies must be present with the
//! right shape; unknown tensors are an error (they mean the config and weights disagree),
//! except HF's non-persistent `rotary_emb.inv_freq` buffers and `lm_head.weight` when tied.
//!
//! Saving is atomic: everything is written to a temporary sibling directory which is then
//! renamed into place (an existing directory is moved aside first and removed afterwards),
//! so a crash never leaves a half-written checkpoint under the final name.
//! Files must not be modified while a model is loading from them (they are memory-mapped).

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::hf_names::{LM_HEAD, parameter_shapes};
use crate::transformer::Transformer;
use candle_core::{DType, Device, Tensor};
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// Tokenizer files copied by `save_with_tokenizer` when present in the source directory
/// (plus every `*.jinja` chat template).
pub const TOKENIZER_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

/// The memory-mapped safetensors files of one checkpoint and which file holds which tensor.
struct WeightFiles {
    files: Vec<(PathBuf, memmap2::Mmap)>,
    location: HashMap<String, usize>,
}

impl WeightFiles {
    fn open(dir: &Path) -> Result<WeightFiles, ModelError> {
        let single = dir.join(WEIGHTS_FILE);
        let index = dir.join(WEIGHTS_INDEX_FILE);
        let paths: Vec<PathBuf> = if single.is_file() {
            vec![single]
        } else if index.is_file() {
            shard_paths(dir, &index)?
        } else {
            return Err(ModelError::MissingFile {
                path: single,
                hint: format!(" (nor {WEIGHTS_INDEX_FILE})"),
            });
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut location = HashMap::new();
        for (file_index, path) in paths.into_iter().enumerate() {
            let mmap = map_file(&path)?;
            let names: Vec<String> = parse_safetensors(&path, &mmap)?
                .names()
                .into_iter()
                .map(String::from)
                .collect();
            for name in names {
                location.insert(name, file_index);
            }
            files.push((path, mmap));
        }
        Ok(WeightFiles { files, location })
    }

    /// The tensor `name` as f32 (converted from bf16/f16), checked against `shape`.
    fn load_f32(&self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor, ModelError> {
        let Some(&file_index) = self.location.get(name) else {
            let path = match self.files.as_slice() {
                [(p, _)] => p.clone(),
                _ => PathBuf::from(WEIGHTS_INDEX_FILE),
            };
            return Err(ModelError::MissingTensor {
                path,
                tensor: name.into(),
                detail: String::new(),
            });
        };
        let (path, mmap) = &self.files[file_index];
        let view = parse_safetensors(path, mmap)?.tensor(name).map_err(|e| {
            ModelError::CorruptSafetensors {
                path: path.clone(),
                message: e.to_string(),
            }
        })?;
        if view.shape() != shape {
            return Err(ModelError::ShapeMismatch {
                path: path.clone(),
                tensor: name.into(),
                expected: shape.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        let bytes = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(ModelError::UnsupportedDtype {
                    path: path.clone(),
                    tensor: name.into(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        Ok(Tensor::from_vec(values, shape, device)?)
    }

    /// A config may announce MTP modules its checkpoint does not carry (transformers'
    /// `DeepseekV3ForCausalLM` neither loads nor saves them, and its config defaults to one):
    /// the model then has the modules present, and `num_mtp_layers` says so. A module with some
    /// of its tensors is kept, so the load names the missing one.
    fn count_mtp_modules(&self, config: &mut ModelConfig) {
        let layers = config.num_hidden_layers;
        for depth in 0..config.num_mtp_layers {
            let prefix = format!("model.layers.{}.", layers + depth);
            if !self.location.keys().any(|name| name.starts_with(&prefix)) {
                config.num_mtp_layers = depth;
                return;
            }
        }
    }

    /// Tensors present in the files that the model does not use.
    fn unexpected(
        &self,
        expected: &BTreeSet<String>,
        config: &ModelConfig,
    ) -> Option<(PathBuf, String)> {
        // DeepSeek-V3's MTP layers carry copies of the embedding and the LM head, which the
        // modules share with the model (as transformers' MtpModel does).
        let mtp_copy = |name: &str| {
            name.strip_prefix("model.layers.")
                .and_then(|rest| rest.split_once('.'))
                .is_some_and(|(layer, tail)| {
                    layer
                        .parse::<usize>()
                        .is_ok_and(|l| l >= config.num_hidden_layers)
                        && (tail == "embed_tokens.weight" || tail == "shared_head.head.weight")
                })
        };
        let ignorable = |name: &str| {
            name.ends_with("rotary_emb.inv_freq")
                || (config.tie_word_embeddings && name == LM_HEAD)
                || mtp_copy(name)
        };
        let mut names: Vec<(&String, &usize)> = self.location.iter().collect();
        names.sort();
        names
            .into_iter()
            .find(|(name, _)| !expected.contains(*name) && !ignorable(name))
            .map(|(name, &file_index)| (self.files[file_index].0.clone(), name.clone()))
    }
}

fn shard_paths(dir: &Path, index: &Path) -> Result<Vec<PathBuf>, ModelError> {
    #[derive(serde::Deserialize)]
    struct ShardIndex {
        weight_map: BTreeMap<String, String>,
    }
    let text = std::fs::read_to_string(index).map_err(|e| ModelError::io(index, e))?;
    let parsed: ShardIndex = serde_path_to_error::deserialize(
        &mut serde_json::Deserializer::from_str(&text),
    )
    .map_err(|e| ModelError::MalformedJson {
        path: index.to_path_buf(),
        field: e.path().to_string(),
        message: e.inner().to_string(),
    })?;
    let files: BTreeSet<&String> = parsed.weight_map.values().collect();
    files
        .into_iter()
        .map(|file| {
            let path = dir.join(file);
            if file.contains('/') || file.contains("..") {
                Err(ModelError::InvalidConfig {
                    path: index.to_path_buf(),
                    field: "weight_map".into(),
                    message: format!("shard name {file:?} is not a plain file name"),
                })
            } else if path.is_file() {
                Ok(path)
            } else {
                Err(ModelError::MissingFile {
                    path,
                    hint: format!(" (listed in {WEIGHTS_INDEX_FILE})"),
                })
            }
        })
        .collect()
}

#[allow(unsafe_code)]
fn map_file(path: &Path) -> Result<memmap2::Mmap, ModelError> {
    let file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the mapping is read-only and lives as long as `WeightFiles`; the module contract
    // (and the user documentation) requires that checkpoint files are not modified while a
    // model loads from them, which is the condition memmap2 asks callers to uphold.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))
}

fn parse_safetensors<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>, ModelError> {
    SafeTensors::deserialize(bytes).map_err(|e| ModelError::CorruptSafetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

impl Transformer {
    /// Loads a Hugging Face checkpoint directory (see module docs) with f32 parameters.
    /// A file (not a folder) is loaded as GGUF with [`Transformer::load_gguf`].
    pub fn load(dir: &Path, device: &Device) -> Result<Transformer, ModelError> {
        // A file (not a folder) can only be a GGUF; its reader says why if it is not one.
        if dir.is_file() {
            return Transformer::load_gguf(dir, device);
        }
        if !dir.is_dir() {
            return Err(ModelError::MissingDir(dir.to_path_buf()));
        }
        let mut config = ModelConfig::from_file(&dir.join(CONFIG_FILE))?;
        let weights = WeightFiles::open(dir)?;
        weights.count_mtp_modules(&mut config);
        let shapes = parameter_shapes(&config);
        let mut tensors = BTreeMap::new();
        for (name, shape) in &shapes {
            tensors.insert(name.clone(), weights.load_f32(name, shape, device)?);
        }
        let expected: BTreeSet<String> = shapes.into_iter().map(|(n, _)| n).collect();
        if let Some((path, tensor)) = weights.unexpected(&expected, &config) {
            return Err(ModelError::UnexpectedTensor { path, tensor });
        }
        Transformer::from_tensors(config, tensors)
    }

    /// Writes config.json, model.safetensors (f32) and generation_config.json to `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        self.save_with_tokenizer(dir, None)
    }

    /// Like `save`, and copies the tokenizer files and generation_config.json found in
    /// `source_dir` (typically the directory the model was loaded from).
    pub fn save_with_tokenizer(
        &self,
        dir: &Path,
        source_dir: Option<&Path>,
    ) -> Result<(), ModelError> {
        self.refuse_inference_only("save")?;
        let staging = sibling(dir, "tmp")?;
        let result = self
            .write_files(&staging, source_dir)
            .and_then(|()| publish(&staging, dir));
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        result
    }

    fn write_files(&self, staging: &Path, source_dir: Option<&Path>) -> Result<(), ModelError> {
        if staging.exists() {
            std::fs::remove_dir_all(staging).map_err(|e| ModelError::io(staging, e))?;
        }
        std::fs::create_dir_all(staging).map_err(|e| ModelError::io(staging, e))?;
        write_json(&staging.join(CONFIG_FILE), &self.config().to_hf_json())?;

        let mut views = Vec::new();
        for (name, var) in self.parameters() {
            let tensor = var
                .as_tensor()
                .to_dtype(DType::F32)?
                .to_device(&candle_core::Device::Cpu)?
                .contiguous()?;
            views.push((name, F32View::new(tensor)?));
        }
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        let weights_path = staging.join(WEIGHTS_FILE);
        safetensors::serialize_to_file(views, Some(metadata), &weights_path).map_err(|e| {
            ModelError::Io {
                path: weights_path.clone(),
                source: std::io::Error::other(e.to_string()),
            }
        })?;
        // safetensors writes through a temporary file, created 0600; the weights take the mode
        // config.json got from `std::fs::write` (0666 less the umask), like every other file.
        let mode = std::fs::metadata(staging.join(CONFIG_FILE))
            .map_err(|e| ModelError::io(staging, e))?
            .permissions();
        std::fs::set_permissions(&weights_path, mode)
            .map_err(|e| ModelError::io(&weights_path, e))?;

        let source_generation = source_dir
            .map(|s| s.join(GENERATION_CONFIG_FILE))
            .filter(|p| p.is_file());
        match source_generation {
            Some(path) => copy(&path, &staging.join(GENERATION_CONFIG_FILE))?,
            None => write_json(
                &staging.join(GENERATION_CONFIG_FILE),
                &self.generation_config_json(),
            )?,
        }
        if let Some(source) = source_dir.filter(|s| stoke_gguf::is_gguf(s)) {
            crate::gguf::write_tokenizer_files(source, staging)?;
        } else if let Some(source) = source_dir {
            let entries = std::fs::read_dir(source).map_err(|e| ModelError::io(source, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| ModelError::io(source, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if (TOKENIZER_FILES.contains(&name.as_str()) || name.ends_with(".jinja"))
                    && entry.path().is_file()
                {
                    copy(&entry.path(), &staging.join(&name))?;
                }
            }
        }
        Ok(())
    }

    fn generation_config_json(&self) -> serde_json::Value {
        let config = self.config();
        let eos = match config.eos_token_ids.as_slice() {
            [] => serde_json::Value::Null,
            [one] => (*one).into(),
            many => many.to_vec().into(),
        };
        serde_json::json!({
            "_from_model_config": true,
            "bos_token_id": config.bos_token_id,
            "eos_token_id": eos,
        })
    }
}

/// A contiguous little-endian f32 tensor for the safetensors writer.
/// One contiguous f32 CPU tensor for safetensors, turned into bytes only when it is written
/// (`data`), so a save holds one tensor's bytes at a time rather than a second copy of the whole
/// model (at 1B shapes that copy was 5 GB).
struct F32View {
    shape: Vec<usize>,
    tensor: Tensor,
}

impl F32View {
    /// Checks once that `tensor` is what `data` reads (contiguous f32 on the CPU).
    fn new(tensor: Tensor) -> Result<F32View, ModelError> {
        {
            let (storage, layout) = tensor.storage_and_layout();
            if !matches!(
                &*storage,
                candle_core::Storage::Cpu(candle_core::CpuStorage::F32(_))
            ) || layout.contiguous_offsets().is_none()
            {
                return Err(ModelError::InvalidArgument(
                    "save: a parameter is not a contiguous f32 CPU tensor".into(),
                ));
            }
        }
        Ok(F32View {
            shape: tensor.dims().to_vec(),
            tensor,
        })
    }
}

impl View for F32View {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let (storage, layout) = self.tensor.storage_and_layout();
        let bytes = match (&*storage, layout.contiguous_offsets()) {
            (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(values)), Some((a, b))) => {
                values[a..b].iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            // Unreachable: `new` checked the storage, and tensors are immutable views.
            _ => Vec::new(),
        };
        Cow::Owned(bytes)
    }
    fn data_len(&self) -> usize {
        self.tensor.elem_count() * 4
    }
}

/// `.NAME.KIND-PID-NANOS` next to `dir`.
fn sibling(dir: &Path, kind: &str) -> Result<PathBuf, ModelError> {
    let name = dir.file_name().ok_or_else(|| {
        ModelError::InvalidArgument(format!("save: {} has no final component", dir.display()))
    })?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let unique = format!(
        ".{}.{kind}-{}-{nanos}",
        name.to_string_lossy(),
        std::process::id()
    );
    Ok(dir.with_file_name(unique))
}

fn publish(staging: &Path, dir: &Path) -> Result<(), ModelError> {
    if dir.exists() {
        let old = sibling(dir, "old")?;
        std::fs::rename(dir, &old).map_err(|e| ModelError::io(dir, e))?;
        std::fs::rename(staging, dir).map_err(|e| ModelError::io(dir, e))?;
        std::fs::remove_dir_all(&old).map_err(|e| ModelError::io(&old, e))
    } else {
        std::fs::rename(staging, dir).map_err(|e| ModelError::io(dir, e))
    }
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), ModelError> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|e| ModelError::io(path, std::io::Error::other(e)))?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| ModelError::io(path, e))
}

fn copy(from: &Path, to: &Path) -> Result<(), ModelError> {
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| ModelError::io(from, e))
}
