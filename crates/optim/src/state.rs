//! The optimizer-state file: one safetensors file holding every state tensor (f32, or u8 for
//! 8-bit moments), with a JSON
//! record in the safetensors metadata (key `stoke_optim_state`) carrying the format version,
//! the step count, the optimizer config and an xxh3-64 checksum of every tensor's bytes.
//!
//! What it is: writing such a file (to a temporary sibling, renamed into place by
//! `safetensors::serialize_to_file`) and reading it back with every check a resume needs:
//! valid safetensors structure (a truncated file fails here), a parseable header record,
//! the expected dtype, the checksum of each tensor (a flipped byte in the data fails here, naming the
//! tensor), and, through `take`/`expect_all_taken`, exactly the expected names and shapes.
//! What it is not: the mapping from parameters to tensor names (`optimizer.rs` decides it: the
//! tensor of parameter `P`'s state `S` is named `P.S` with PyTorch's state names).
//! Invariants: tensors are stored little-endian exactly as held in memory, so
//! save -> load restores the state bit for bit; reading never panics on any file content.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, View};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use crate::config::OptimizerConfig;
use crate::error::OptimError;

/// Metadata key under which the header record is stored.
const HEADER_KEY: &str = "stoke_optim_state";
/// Bumped whenever the layout of the file changes incompatibly.
const FORMAT_VERSION: u32 = 1;

/// What the header records besides the tensors.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StateHeader {
    /// Optimizer steps completed when the state was saved.
    pub steps: u64,
    pub config: OptimizerConfig,
}

impl StateHeader {
    pub fn new(steps: u64, config: OptimizerConfig) -> Self {
        StateHeader { steps, config }
    }
}

/// The JSON record stored in the safetensors metadata.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderRecord {
    format_version: u32,
    steps: u64,
    config: OptimizerConfig,
    /// Tensor name -> xxh3-64 of its little-endian bytes, as 16 hex digits.
    checksums: BTreeMap<String, String>,
}

/// Borrowed state values.
#[derive(Clone, Copy)]
pub(crate) enum StateData<'a> {
    F32(&'a [f32]),
    U8(&'a [u8]),
}

/// A state tensor to write: borrowed data with its name and shape.
pub(crate) struct StateTensorRef<'a> {
    name: String,
    shape: Vec<usize>,
    data: StateData<'a>,
}

impl<'a> StateTensorRef<'a> {
    pub fn new(param: &str, state_key: &str, shape: &[usize], data: &'a [f32]) -> Self {
        Self::with_data(param, state_key, shape, StateData::F32(data))
    }

    pub fn with_data(param: &str, state_key: &str, shape: &[usize], data: StateData<'a>) -> Self {
        StateTensorRef {
            name: tensor_name(param, state_key),
            shape: shape.to_vec(),
            data,
        }
    }
}

impl View for &StateTensorRef<'_> {
    fn dtype(&self) -> Dtype {
        match self.data {
            StateData::F32(_) => Dtype::F32,
            StateData::U8(_) => Dtype::U8,
        }
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        match self.data {
            StateData::F32(d) => {
                std::borrow::Cow::Owned(d.iter().flat_map(|x| x.to_le_bytes()).collect())
            }
            StateData::U8(d) => std::borrow::Cow::Borrowed(d),
        }
    }
    fn data_len(&self) -> usize {
        match self.data {
            StateData::F32(d) => d.len() * 4,
            StateData::U8(d) => d.len(),
        }
    }
}

fn tensor_name(param: &str, state_key: &str) -> String {
    format!("{param}.{state_key}")
}

/// xxh3-64 of the little-endian bytes of `data`, converted in small blocks (no full copy).
fn checksum(data: &[f32]) -> String {
    let mut hasher = Xxh3::new();
    let mut block = Vec::with_capacity(4096 * 4);
    for chunk in data.chunks(4096) {
        block.clear();
        block.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
        hasher.update(&block);
    }
    format!("{:016x}", hasher.digest())
}

fn checksum_bytes(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

/// Writes `tensors` and `header` to `path` (temporary sibling + rename).
pub(crate) fn write_state(
    path: &Path,
    header: StateHeader,
    tensors: Vec<StateTensorRef<'_>>,
) -> Result<(), OptimError> {
    let checksums = tensors
        .iter()
        .map(|t| {
            let sum = match t.data {
                StateData::F32(d) => checksum(d),
                StateData::U8(d) => checksum_bytes(d),
            };
            (t.name.clone(), sum)
        })
        .collect();
    let record = HeaderRecord {
        format_version: FORMAT_VERSION,
        steps: header.steps,
        config: header.config,
        checksums,
    };
    let record = serde_json::to_string(&record).map_err(|e| format_error(path, e.to_string()))?;
    let metadata = HashMap::from([(HEADER_KEY.to_string(), record)]);
    let views = tensors.iter().map(|t| (t.name.clone(), t));
    safetensors::tensor::serialize_to_file(views, Some(metadata), path).map_err(|e| match e {
        safetensors::SafeTensorError::IoError(source) => OptimError::StateIo {
            path: path.to_path_buf(),
            source,
        },
        other => format_error(path, format!("could not write: {other}")),
    })
}

/// A read and fully verified state file; tensors are handed out once each by `take`.
pub(crate) struct StateFile {
    path: PathBuf,
    header: StateHeader,
    tensors: BTreeMap<String, (Vec<usize>, Values)>,
}

/// A read tensor's values.
enum Values {
    F32(Vec<f32>),
    U8(Vec<u8>),
}

impl StateFile {
    /// Reads `path` and verifies structure, header, dtypes and checksums.
    pub fn read(path: &Path) -> Result<StateFile, OptimError> {
        let bytes = std::fs::read(path).map_err(|source| OptimError::StateIo {
            path: path.to_path_buf(),
            source,
        })?;
        let safetensors = SafeTensors::deserialize(&bytes).map_err(|e| {
            format_error(
                path,
                format!("not a valid safetensors file (truncated or corrupted?): {e}"),
            )
        })?;
        let (_, metadata) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| format_error(path, format!("unreadable header: {e}")))?;
        let record_text = metadata
            .metadata()
            .as_ref()
            .and_then(|m| m.get(HEADER_KEY))
            .ok_or_else(|| {
                format_error(
                    path,
                    format!(
                        "no `{HEADER_KEY}` record in the header (not a stoke optimizer state?)"
                    ),
                )
            })?;
        let record: HeaderRecord = serde_json::from_str(record_text)
            .map_err(|e| format_error(path, format!("header record `{HEADER_KEY}`: {e}")))?;
        if record.format_version != FORMAT_VERSION {
            return Err(format_error(
                path,
                format!(
                    "format version {} (this build reads version {FORMAT_VERSION})",
                    record.format_version
                ),
            ));
        }
        let mut tensors = BTreeMap::new();
        for (name, view) in safetensors.iter() {
            let tensor_error = |reason: String| OptimError::StateTensor {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                reason,
            };
            if !matches!(view.dtype(), Dtype::F32 | Dtype::U8) {
                return Err(tensor_error(format!(
                    "dtype {:?}, expected F32 (or U8 for 8-bit moments)",
                    view.dtype()
                )));
            }
            let expected = record
                .checksums
                .get(name)
                .ok_or_else(|| tensor_error("has no checksum in the header record".to_string()))?;
            let actual = checksum_bytes(view.data());
            if &actual != expected {
                return Err(tensor_error(format!(
                    "checksum mismatch (header {expected}, data {actual}): the file is corrupted"
                )));
            }
            let values = if view.dtype() == Dtype::U8 {
                Values::U8(view.data().to_vec())
            } else {
                Values::F32(
                    view.data()
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                )
            };
            tensors.insert(name.to_string(), (view.shape().to_vec(), values));
        }
        if let Some(missing) = record
            .checksums
            .keys()
            .find(|name| !tensors.contains_key(*name))
        {
            return Err(OptimError::StateTensor {
                path: path.to_path_buf(),
                tensor: missing.clone(),
                reason: "listed in the header record but missing from the file".to_string(),
            });
        }
        let header = StateHeader {
            steps: record.steps,
            config: record.config,
        };
        Ok(StateFile {
            path: path.to_path_buf(),
            header,
            tensors,
        })
    }

    pub fn header(&self) -> &StateHeader {
        &self.header
    }

    /// Removes and returns the state `state_key` of parameter `param`, which must have `shape`.
    pub fn take(
        &mut self,
        param: &str,
        state_key: &str,
        shape: &[usize],
    ) -> Result<Vec<f32>, OptimError> {
        match self.take_values(param, state_key, shape)? {
            Values::F32(values) => Ok(values),
            Values::U8(_) => Err(self.tensor_error(
                &tensor_name(param, state_key),
                "is U8 (8-bit moments) in the file, this optimizer keeps F32 state",
            )),
        }
    }

    /// `take` for a U8 tensor (8-bit moments).
    pub fn take_u8(
        &mut self,
        param: &str,
        state_key: &str,
        shape: &[usize],
    ) -> Result<Vec<u8>, OptimError> {
        match self.take_values(param, state_key, shape)? {
            Values::U8(values) => Ok(values),
            Values::F32(_) => Err(self.tensor_error(
                &tensor_name(param, state_key),
                "is F32 in the file, this optimizer keeps 8-bit moments",
            )),
        }
    }

    fn take_values(
        &mut self,
        param: &str,
        state_key: &str,
        shape: &[usize],
    ) -> Result<Values, OptimError> {
        let name = tensor_name(param, state_key);
        let Some((saved_shape, values)) = self.tensors.remove(&name) else {
            return Err(self.tensor_error(&name, "missing from the file (parameter set differs?)"));
        };
        if saved_shape != shape {
            return Err(self.tensor_error(
                &name,
                &format!("shape {saved_shape:?} in the file, the parameter has {shape:?}"),
            ));
        }
        Ok(values)
    }

    /// Fails, naming the first one, if the file holds tensors no parameter asked for.
    pub fn expect_all_taken(&self) -> Result<(), OptimError> {
        match self.tensors.keys().next() {
            Some(name) => Err(self.tensor_error(
                name,
                "is not the state of any parameter of this optimizer (parameter set differs?)",
            )),
            None => Ok(()),
        }
    }

    pub fn format_error(&self, reason: String) -> OptimError {
        format_error(&self.path, reason)
    }

    fn tensor_error(&self, tensor: &str, reason: &str) -> OptimError {
        OptimError::StateTensor {
            path: self.path.clone(),
            tensor: tensor.to_string(),
            reason: reason.to_string(),
        }
    }
}

fn format_error(path: &Path, reason: String) -> OptimError {
    OptimError::StateFormat {
        path: path.to_path_buf(),
        reason,
    }
}
