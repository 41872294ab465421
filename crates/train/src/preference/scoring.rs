//! Log-probs of preference pairs under a model, and the reference's log-probs cached on disk.
//!
//! A micro-batch of pairs is scored in one forward pass. With [`ScoringLayout::SharedPrefix`]
//! each pair is one packed sequence `[prompt, chosen, rejected]`: both responses see the prompt
//! and their own earlier tokens only, at the positions they would have alone, and nothing pads
//! the space between them (open-instruct #1900 counted such padding). The prompt then runs once
//! per pair instead of twice. [`ScoringLayout::Rows`] scores each response as its own row; the
//! two give the same log-probs and gradients up to float rounding (tests/preference_train.rs).
//! Both go through `grpo::completion_logprobs_with`, the GRPO scorer.
//!
//! The reference cache: the reference model's per-sequence sums for every pair of a dataset,
//! computed once and written to `ref-logps-<key>.json`, where the key hashes the pairs' token
//! ids (so the data, the tokenizer and its chat template) and the reference model's weights. A
//! run with the cache holds one model; the values are stored as their f64 bits, so a cached
//! reference equals a live one bit for bit.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};
use stoke_model::Transformer;
use xxhash_rust::xxh3::Xxh3;

use super::SequenceLogps;
use super::data::PreferencePair;
use crate::error::TrainError;
use crate::grpo::{ScoringLayout, SequenceRow, completion_logprobs_with};

/// Per-sequence log-probs of `pairs` under `model` (with the graph), rows
/// `[chosen_0..chosen_B, rejected_0..rejected_B]` as the losses take them.
pub fn pair_logps(
    model: &Transformer,
    pairs: &[&PreferencePair],
    layout: ScoringLayout,
) -> Result<SequenceLogps, TrainError> {
    let mut rows = Vec::with_capacity(2 * pairs.len());
    for pair in pairs {
        rows.push(SequenceRow {
            prompt_ids: &pair.prompt_ids,
            completion_ids: &pair.chosen_ids,
        });
        rows.push(SequenceRow {
            prompt_ids: &pair.prompt_ids,
            completion_ids: &pair.rejected_ids,
        });
    }
    let scores = completion_logprobs_with(model, &rows, 1.0, false, layout)?;
    // Scored interleaved (c0, r0, c1, r1, ...) so each pair shares its prefix; the losses take
    // [chosen; rejected].
    let b = pairs.len() as u32;
    let order: Vec<u32> = (0..b)
        .map(|i| 2 * i)
        .chain((0..b).map(|i| 2 * i + 1))
        .collect();
    let index = Tensor::from_vec(order, 2 * pairs.len(), model.device())?;
    let logprobs = scores.logprobs.index_select(&index, 0)?;
    let lengths: Vec<usize> = pairs
        .iter()
        .map(|p| p.chosen_ids.len())
        .chain(pairs.iter().map(|p| p.rejected_ids.len()))
        .collect();
    SequenceLogps::pairs(&logprobs, &lengths)
}

/// One pair's reference values: `[shared, tail]` of the chosen and of the rejected response.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairReference {
    pub chosen: [f64; 2],
    pub rejected: [f64; 2],
}

/// Reference values for `pairs` from their cached entries, as the losses take them.
pub fn reference_logps(
    pairs: &[&PreferencePair],
    entries: &[PairReference],
    device: &Device,
) -> Result<SequenceLogps, TrainError> {
    let shared = entries
        .iter()
        .map(|e| e.chosen[0])
        .chain(entries.iter().map(|e| e.rejected[0]))
        .collect();
    let tail = entries
        .iter()
        .map(|e| e.chosen[1])
        .chain(entries.iter().map(|e| e.rejected[1]))
        .collect();
    let tokens = pairs
        .iter()
        .map(|p| p.chosen_ids.len())
        .chain(pairs.iter().map(|p| p.rejected_ids.len()))
        .collect();
    SequenceLogps::from_values(shared, tail, tokens, device)
}

/// The reference's values for a micro-batch, scored now (no graph).
pub fn score_reference(
    model: &Transformer,
    pairs: &[&PreferencePair],
    layout: ScoringLayout,
) -> Result<Vec<PairReference>, TrainError> {
    let logps = pair_logps(model, pairs, layout)?;
    let shared = logps
        .shared
        .detach()
        .to_dtype(DType::F64)?
        .to_vec1::<f64>()?;
    let tail = logps.tail.detach().to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let b = pairs.len();
    Ok((0..b)
        .map(|i| PairReference {
            chosen: [shared[i], tail[i]],
            rejected: [shared[b + i], tail[b + i]],
        })
        .collect())
}

/// On disk each entry is the four values' IEEE bits (chosen shared, chosen tail, rejected
/// shared, rejected tail): exact whatever the JSON float parser does.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheFile {
    key: String,
    pairs: usize,
    entries: Vec<[u64; 4]>,
}

/// The cache key of `pairs` under `reference`: xxh3-64 of the model's precision, every pair's
/// token ids (lengths included) and every weight's name, shape, dtype and bytes.
pub fn cache_key(reference: &Transformer, pairs: &[PreferencePair]) -> Result<String, TrainError> {
    let mut hash = Xxh3::new();
    hash.update(b"stoke-preference-reference-v1");
    // bf16 products give other values than f32 ones.
    hash.update(format!("{:?}", reference.precision()).as_bytes());
    for pair in pairs {
        for ids in [&pair.prompt_ids, &pair.chosen_ids, &pair.rejected_ids] {
            hash.update(&(ids.len() as u64).to_le_bytes());
            for id in ids.iter() {
                hash.update(&id.to_le_bytes());
            }
        }
    }
    for (name, var) in reference.parameters() {
        let tensor = var.as_tensor();
        hash.update(name.as_bytes());
        hash.update(format!("{:?}{:?}", tensor.dims(), tensor.dtype()).as_bytes());
        let flat = tensor
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?;
        for chunk in flat.chunks(1 << 16) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
            hash.update(&bytes);
        }
    }
    Ok(format!("{:016x}", hash.digest()))
}

/// Where the cache of `key` lives under `dir`.
pub fn cache_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("ref-logps-{key}.json"))
}

/// The cached reference values of `key`, if a complete cache for `pairs` pairs is there.
pub fn load_cache(
    dir: &Path,
    key: &str,
    pairs: usize,
) -> Result<Option<Vec<PairReference>>, TrainError> {
    let path = cache_path(dir, key);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(TrainError::Other(format!("{}: {e}", path.display()))),
    };
    let file: CacheFile = serde_json::from_str(&text)
        .map_err(|e| TrainError::Other(format!("{}: {e}", path.display())))?;
    if file.key != key || file.pairs != pairs || file.entries.len() != pairs {
        return Err(TrainError::Other(format!(
            "{}: holds {} entries for key {} ({} pairs), expected key {key} with {pairs}",
            path.display(),
            file.entries.len(),
            file.key,
            file.pairs
        )));
    }
    Ok(Some(
        file.entries
            .iter()
            .map(|bits| PairReference {
                chosen: [f64::from_bits(bits[0]), f64::from_bits(bits[1])],
                rejected: [f64::from_bits(bits[2]), f64::from_bits(bits[3])],
            })
            .collect(),
    ))
}

/// Writes the cache atomically (a temporary file, then a rename), so a killed run never leaves
/// a half-written cache behind.
pub fn save_cache(dir: &Path, key: &str, entries: &[PairReference]) -> Result<PathBuf, TrainError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| TrainError::Other(format!("{}: {e}", dir.display())))?;
    let path = cache_path(dir, key);
    let file = CacheFile {
        key: key.to_string(),
        pairs: entries.len(),
        entries: entries
            .iter()
            .map(|e| {
                [
                    e.chosen[0].to_bits(),
                    e.chosen[1].to_bits(),
                    e.rejected[0].to_bits(),
                    e.rejected[1].to_bits(),
                ]
            })
            .collect(),
    };
    let text = serde_json::to_string(&file)
        .map_err(|e| TrainError::Other(format!("reference cache: {e}")))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(|e| TrainError::Other(format!("{}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, &path)
        .map_err(|e| TrainError::Other(format!("{}: {e}", path.display())))?;
    Ok(path)
}
