//! The served weights: loading a Hugging Face directory for serving, and the checksum a client
//! compares after a weight sync.
//!
//! The checksum is xxh3-64 over every parameter in name order: the name, the shape and the f32
//! little-endian bytes of the values. A trainer that holds the same weights (`stoke_model`
//! loaded from the directory it wrote, or its own model) gets the same string from
//! [`weights_checksum`], so `GET /weights/checksum` after `POST /update_weights` proves the sync.

use std::path::Path;

use candle_core::{DType, Device};
use stoke_model::Transformer;
use stoke_types::Precision;
use xxhash_rust::xxh3::Xxh3;

/// `xxh3:<16 hex digits>` of `model`'s parameters (see the module doc).
pub fn weights_checksum(model: &Transformer) -> Result<String, String> {
    let mut hash = Xxh3::new();
    let mut parameters = model.parameters();
    parameters.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, var) in parameters {
        let tensor = var.as_tensor();
        hash.update(name.as_bytes());
        for &dim in tensor.dims() {
            hash.update(&(dim as u64).to_le_bytes());
        }
        let values = tensor
            .flatten_all()
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| format!("{name}: {e}"))?;
        for chunk in values.chunks(1 << 16) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
            hash.update(&bytes);
        }
    }
    Ok(format!("xxh3:{:016x}", hash.digest()))
}

/// Loads `dir` for serving in `precision` (bf16 packs the weights once for the decode step) and
/// returns it with its checksum.
pub fn load_for_serving(dir: &Path, precision: Precision) -> Result<(Transformer, String), String> {
    if !dir.exists() {
        return Err(format!(
            "{} does not exist (a model directory or a GGUF file)",
            dir.display()
        ));
    }
    let mut model =
        Transformer::load(dir, &Device::Cpu).map_err(|e| format!("{}: {e}", dir.display()))?;
    if model.is_token_classifier() {
        return Err(format!(
            "{} is a token classifier (a process reward model): it scores steps and has no LM \
             head, so it cannot generate",
            dir.display()
        ));
    }
    if model.is_classifier() {
        // Refused here, at start-up and at a weight update, not at the first request.
        return Err(format!(
            "{} is a sequence classifier (a reward model): it scores sequences and has no LM \
             head, so it cannot generate; serve it with `--task reward` (the /classify route)",
            dir.display()
        ));
    }
    if precision == Precision::Bf16 {
        model
            .pack_weights()
            .map_err(|e| format!("{}: packing bf16 weights: {e}", dir.display()))?;
    }
    let checksum = weights_checksum(&model)?;
    Ok((model, checksum))
}
