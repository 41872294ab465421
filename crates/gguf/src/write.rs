//! Writing a GGUF v3 file: metadata, tensor directory and 32-byte-aligned tensor data.
//!
//! Tensors are encoded one at a time as the data section is written (`encode` is called once per
//! tensor, in order), so an export holds one tensor's bytes besides the model. The file is written
//! under a temporary sibling name and renamed into place, so a failure never leaves a partial file
//! under the final name.

use std::io::Write;
use std::path::Path;

use crate::error::GgufError;
use crate::quant::GgmlType;
use crate::read::{DEFAULT_ALIGNMENT, Value};

/// One tensor to write: its name, row-major shape and type.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: GgmlType,
}

impl TensorSpec {
    fn bytes(&self) -> Result<usize, String> {
        let (block, size) = self.dtype.block().ok_or_else(|| {
            format!(
                "tensor `{}`: type {} cannot be written",
                self.name, self.dtype
            )
        })?;
        let elements: usize = self.shape.iter().product();
        if self.shape.last().is_none_or(|row| row % block != 0) {
            return Err(format!(
                "tensor `{}`: rows of shape {:?} do not divide into {} blocks of {block}",
                self.name, self.shape, self.dtype
            ));
        }
        Ok(elements / block * size)
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) -> Result<(), String> {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => put_string(out, s),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Array(items) => {
            let code = items.first().map_or(8, Value::type_code);
            if items.iter().any(|v| v.type_code() != code) {
                return Err("an array mixes value types".into());
            }
            out.extend_from_slice(&code.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item)?;
            }
        }
    }
    Ok(())
}

/// Writes `path`: `metadata` in order, then `tensors`, whose bytes `encode(i)` returns.
pub fn write_gguf(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    mut encode: impl FnMut(usize) -> Result<Vec<u8>, String>,
) -> Result<(), GgufError> {
    let bad = |message: String| GgufError::Malformed {
        path: path.to_path_buf(),
        what: "writing".into(),
        message,
    };
    let align = DEFAULT_ALIGNMENT;
    let mut header = Vec::new();
    header.extend_from_slice(b"GGUF");
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    header.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut header, key);
        header.extend_from_slice(&value.type_code().to_le_bytes());
        put_value(&mut header, value).map_err(|m| bad(format!("metadata key `{key}`: {m}")))?;
    }
    let mut sizes = Vec::with_capacity(tensors.len());
    let mut offset = 0usize;
    for spec in tensors {
        let size = spec.bytes().map_err(bad)?;
        put_string(&mut header, &spec.name);
        header.extend_from_slice(&(spec.shape.len() as u32).to_le_bytes());
        for &d in spec.shape.iter().rev() {
            header.extend_from_slice(&(d as u64).to_le_bytes());
        }
        header.extend_from_slice(&spec.dtype.code().to_le_bytes());
        header.extend_from_slice(&(offset as u64).to_le_bytes());
        sizes.push(size);
        offset += size.div_ceil(align) * align;
    }
    header.resize(header.len().div_ceil(align) * align, 0);

    let name = path
        .file_name()
        .ok_or_else(|| bad("the path has no file name".into()))?;
    let staging = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let file = std::fs::File::create(&staging).map_err(|e| GgufError::io(&staging, e))?;
        let mut out = std::io::BufWriter::new(file);
        let io = |e| GgufError::io(&staging, e);
        out.write_all(&header).map_err(io)?;
        for (i, (spec, &size)) in tensors.iter().zip(&sizes).enumerate() {
            let bytes = encode(i).map_err(|m| bad(format!("tensor `{}`: {m}", spec.name)))?;
            if bytes.len() != size {
                return Err(bad(format!(
                    "tensor `{}`: encoded {} bytes, expected {size}",
                    spec.name,
                    bytes.len()
                )));
            }
            out.write_all(&bytes).map_err(io)?;
            out.write_all(&vec![0u8; size.div_ceil(align) * align - size])
                .map_err(io)?;
        }
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&staging, path).map_err(|e| GgufError::io(path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&staging);
    }
    result
}
