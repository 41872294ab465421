//! Reading a GGUF file: the header, the metadata key/values and the tensor directory, parsed from
//! a memory map with every length checked against the bytes that remain, so a truncated or
//! hostile file gives an error naming the byte offset and what was being read, never a panic or a
//! huge allocation. Tensor data is not touched until [`GgufFile::tensor_f32`] dequantizes one.
//!
//! Layout (GGUF v2/v3, little-endian): `"GGUF"`, version u32, tensor count u64, metadata count
//! u64; the metadata entries (key string, value type u32, value); the tensor infos (name, number
//! of dimensions u32, dimensions u64 with the fastest-varying first, ggml type u32, offset u64
//! into the data section); padding to `general.alignment` (default 32); the data section.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::quant::{self, GgmlType};

/// Longest string a metadata value or name may declare (a vocabulary token, a chat template).
const MAX_STRING_BYTES: u64 = 64 << 20;
/// Nesting depth of arrays of arrays.
const MAX_DEPTH: usize = 3;
/// The most dimensions a tensor may declare (ggml's GGML_MAX_DIMS).
const MAX_DIMS: u32 = 4;
pub const DEFAULT_ALIGNMENT: usize = 32;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }

    /// The GGUF value-type code.
    pub fn type_code(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// A non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// An integer of any width.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A float (or an integer, as llama.cpp's readers accept).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
}

/// Where one tensor lives and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Row-major shape (slowest-varying first), as PyTorch and safetensors write it: the reverse of
    /// the order GGUF stores.
    pub shape: Vec<usize>,
    pub dtype: GgmlType,
    /// Byte range of the data inside the file.
    pub start: usize,
    pub len: usize,
}

impl TensorInfo {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// An open GGUF file: parsed metadata and tensor directory over a memory map of the whole file.
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    index: BTreeMap<String, usize>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
    tensor_index: BTreeMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// True when `path` is a file that starts with the GGUF magic.
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    if !path.is_file() {
        return false;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

impl GgufFile {
    /// Opens and parses `path` (header, metadata and tensor directory; no tensor data).
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let file = std::fs::File::open(path).map_err(|e| GgufError::io(path, e))?;
        #[allow(unsafe_code)]
        // SAFETY: read-only mapping; the file must not be modified while it is open, the same
        // contract as the safetensors loader (documented for users in the README).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| GgufError::io(path, e))?;
        let mut cursor = Cursor {
            bytes: &map,
            at: 0,
            path,
        };
        let magic = cursor.take(4, "the magic")?;
        if magic != b"GGUF" {
            return Err(GgufError::NotGguf {
                path: path.to_path_buf(),
                found: String::from_utf8_lossy(magic).into_owned(),
            });
        }
        let version = cursor.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: path.to_path_buf(),
                version,
            });
        }
        let tensor_count = cursor.u64("the tensor count")?;
        let metadata_count = cursor.u64("the metadata count")?;
        // Each metadata entry takes at least 13 bytes and each tensor info at least 24.
        cursor.fits(metadata_count, 13, "the metadata entries")?;
        cursor.fits(tensor_count, 24, "the tensor infos")?;

        let mut metadata = Vec::with_capacity(metadata_count as usize);
        let mut index = BTreeMap::new();
        for n in 0..metadata_count {
            let key = cursor.string(&format!("metadata key #{n}"))?;
            let code = cursor.u32(&format!("the type of `{key}`"))?;
            let value = cursor.value(code, &key, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(cursor.malformed(format!("metadata key `{key}`"), "appears twice"));
            }
            metadata.push((key, value));
        }
        let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
                _ => {
                    return Err(cursor.malformed(
                        "metadata key `general.alignment`".into(),
                        &format!("{v:?} is not a power of two up to 1 MiB"),
                    ));
                }
            },
        };

        let mut infos = Vec::with_capacity(tensor_count as usize);
        for n in 0..tensor_count {
            let name = cursor.string(&format!("tensor name #{n}"))?;
            let what = |field: &str| format!("the {field} of tensor `{name}`");
            let dims = cursor.u32(&what("number of dimensions"))?;
            if dims == 0 || dims > MAX_DIMS {
                return Err(cursor.malformed(
                    format!("tensor `{name}`"),
                    &format!("{dims} dimensions (1 to {MAX_DIMS} allowed)"),
                ));
            }
            let mut shape = Vec::with_capacity(dims as usize);
            for _ in 0..dims {
                let d = cursor.u64(&what("dimensions"))?;
                shape.push(usize::try_from(d).unwrap_or(usize::MAX));
            }
            shape.reverse();
            let code = cursor.u32(&what("type"))?;
            let offset = cursor.u64(&what("offset"))?;
            infos.push((name, shape, code, offset));
        }
        let data_start = cursor.at.div_ceil(alignment) * alignment;

        let mut tensors = Vec::with_capacity(infos.len());
        let mut tensor_index = BTreeMap::new();
        for (name, shape, code, offset) in infos {
            let dtype = GgmlType::from_code(code);
            let bad = |message: String| GgufError::BadTensor {
                path: path.to_path_buf(),
                tensor: name.clone(),
                message,
            };
            let elements = shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .filter(|&e| e > 0)
                .ok_or_else(|| bad(format!("shape {shape:?} is empty or overflows")))?;
            let len = match dtype.block() {
                Some((block, bytes)) => {
                    let row = *shape.last().unwrap_or(&0);
                    if row % block != 0 {
                        return Err(bad(format!(
                            "rows of {row} values do not divide into {dtype} blocks of {block}"
                        )));
                    }
                    elements / block * bytes
                }
                // Unknown types are sized when read (and refused there, by name).
                None => 0,
            };
            let start = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(data_start))
                .filter(|s| s.checked_add(len).is_some_and(|end| end <= map.len()))
                .ok_or_else(|| {
                    bad(format!(
                        "data ({len} bytes at offset {offset} of the data section) lies past the \
                         end of the file ({} bytes): the file is truncated",
                        map.len()
                    ))
                })?;
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(bad("appears twice in the tensor directory".into()));
            }
            tensors.push(TensorInfo {
                name,
                shape,
                dtype,
                start,
                len,
            });
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version,
            metadata,
            index,
            tensors,
            tensor_index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    fn key_type(&self, key: &str, expected: &str, found: &Value) -> GgufError {
        GgufError::KeyType {
            path: self.path.clone(),
            key: key.into(),
            expected: expected.into(),
            found: found.type_name().into(),
        }
    }

    pub fn missing(&self, key: &str) -> GgufError {
        GgufError::MissingKey {
            path: self.path.clone(),
            key: key.into(),
        }
    }

    /// A string value, if present.
    pub fn str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.key_type(key, "a string", other)),
        }
    }

    /// A non-negative integer value, if present.
    pub fn uint(&self, key: &str) -> Result<Option<u64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.key_type(key, "a non-negative integer", v)),
        }
    }

    /// A float value (integers accepted), if present; must be finite.
    pub fn float(&self, key: &str) -> Result<Option<f64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.key_type(key, "a finite number", v)),
            },
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.key_type(key, "a bool", other)),
        }
    }

    /// An array of strings, if present.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.as_str()),
                    other => Err(self.key_type(key, "an array of strings", other)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(self.key_type(key, "an array of strings", other)),
        }
    }

    /// An array of integers, if present.
    pub fn ints(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_i64()
                        .ok_or_else(|| self.key_type(key, "an array of integers", v))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(self.key_type(key, "an array of integers", other)),
        }
    }

    /// The raw bytes of a tensor.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        &self.map[info.start..info.start + info.len]
    }

    /// Tensor `name` dequantized to f32, with its row-major shape.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor {
                path: self.path.clone(),
                tensor: name.into(),
            })?;
        if info.dtype.block().is_none() {
            return Err(GgufError::TensorType {
                path: self.path.clone(),
                tensor: name.into(),
                dtype: info.dtype.to_string(),
                supported: quant::SUPPORTED.into(),
            });
        }
        let values = quant::dequantize(info.dtype, self.tensor_bytes(info), info.elements())
            .map_err(|message| GgufError::BadTensor {
                path: self.path.clone(),
                tensor: name.into(),
                message,
            })?;
        Ok((info.shape.clone(), values))
    }
}

/// The error for a metadata value stoke does not handle: `key` holds `value`, and `supported`
/// says what would be accepted.
pub(crate) fn unsupported(file: &GgufFile, key: &str, value: &str, supported: &str) -> GgufError {
    GgufError::Unsupported {
        path: file.path().to_path_buf(),
        key: key.into(),
        value: value.into(),
        supported: supported.into(),
    }
}

/// A bounds-checked little-endian reader over the mapped file.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn truncated(&self, what: &str) -> GgufError {
        GgufError::Truncated {
            path: self.path.to_path_buf(),
            offset: self.at,
            what: what.into(),
        }
    }

    fn malformed(&self, what: String, message: &str) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_path_buf(),
            what,
            message: message.into(),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| self.truncated(what))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Refuses a declared count of items that cannot fit in the bytes left.
    fn fits(&self, count: u64, min_bytes: u64, what: &str) -> Result<(), GgufError> {
        let left = (self.bytes.len() - self.at) as u64;
        if count.saturating_mul(min_bytes) > left {
            return Err(self.truncated(&format!(
                "{what} ({count} declared, at least {} bytes, {left} left)",
                count.saturating_mul(min_bytes)
            )));
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        if len > MAX_STRING_BYTES {
            return Err(self.malformed(what.into(), &format!("declares {len} bytes")));
        }
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.malformed(what.into(), "is not valid UTF-8"))
    }

    fn value(&mut self, code: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
        let what = format!("the value of `{key}`");
        Ok(match code {
            0 => Value::U8(self.array::<1>(&what)?[0]),
            1 => Value::I8(i8::from_le_bytes(self.array(&what)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            7 => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(
                        self.malformed(format!("metadata key `{key}`"), &format!("bool byte {b}"))
                    );
                }
            },
            8 => Value::String(self.string(&what)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(
                        self.malformed(format!("metadata key `{key}`"), "arrays nest too deeply")
                    );
                }
                let item = self.u32(&what)?;
                let len = self.u64(&what)?;
                let min = match item {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    _ => 1,
                };
                self.fits(len, min, &what)?;
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(item, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            other => {
                return Err(self.malformed(
                    format!("metadata key `{key}`"),
                    &format!("unknown value type {other}"),
                ));
            }
        })
    }
}
