//! Shared fixtures of the trainer tests: a tiny model config, packed batches built from seeded
//! random documents, an in-memory batch source, and a config for the trainer.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::path::Path;

use candle_core::{Device, Var};
use stoke_data::packing::{DocPiece, PackedBatch, PackedRow, build_batch};
use stoke_model::Transformer;
use stoke_train::config::{ConfigFile, TrainConfig};
use stoke_train::source::{BatchSource, SourceError};

pub const VOCAB: usize = 300;

/// A splitmix64 stream: reproducible test data without a dependency.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A batch of `rows` rows; each row packs documents of the given lengths (then padding).
pub fn batch_from_docs(docs_per_row: &[Vec<Vec<u32>>], seq_len: usize) -> PackedBatch {
    let mut all_docs: Vec<Vec<u32>> = Vec::new();
    let rows: Vec<PackedRow> = docs_per_row
        .iter()
        .map(|docs| PackedRow {
            pieces: docs
                .iter()
                .map(|d| {
                    all_docs.push(d.clone());
                    DocPiece {
                        doc: (all_docs.len() - 1) as u64,
                        start: 0,
                        len: d.len() as u32,
                    }
                })
                .collect(),
        })
        .collect();
    build_batch(&rows, seq_len, 0, |piece, out: &mut Vec<u32>| {
        out.extend_from_slice(&all_docs[piece.doc as usize]);
        Ok::<(), ()>(())
    })
    .expect("fixture batch")
}

/// Random documents of random lengths packed into `rows` rows of `seq_len` (with padding, so
/// rows have different numbers of loss tokens).
pub fn random_batch(rng: &mut Rng, rows: usize, seq_len: usize) -> PackedBatch {
    let docs_per_row: Vec<Vec<Vec<u32>>> = (0..rows)
        .map(|_| {
            let mut docs = Vec::new();
            let mut used = 0;
            let budget = seq_len + 1 - rng.below(seq_len as u64 / 2) as usize;
            while used + 2 <= budget {
                let len = (2 + rng.below(seq_len as u64 / 2) as usize).min(budget - used);
                docs.push((0..len).map(|_| rng.below(VOCAB as u64) as u32).collect());
                used += len;
            }
            docs
        })
        .collect();
    batch_from_docs(&docs_per_row, seq_len)
}

/// Row `r` of a batch as a one-row batch.
pub fn row_of(batch: &PackedBatch, r: usize) -> PackedBatch {
    let t = batch.seq_len;
    let span = r * t..(r + 1) * t;
    PackedBatch {
        batch_size: 1,
        seq_len: t,
        tokens: batch.tokens[span.clone()].to_vec(),
        targets: batch.targets[span.clone()].to_vec(),
        position_ids: batch.position_ids[span.clone()].to_vec(),
        doc_ids: batch.doc_ids[span.clone()].to_vec(),
        loss_mask: batch.loss_mask[span].to_vec(),
        rows: vec![batch.rows[r].clone()],
    }
}

/// Serves a fixed list of batches; the cursor is the number served. `poison` sets a parameter
/// to NaN when the batch with that index is fetched (NaN injection).
pub struct VecSource {
    pub batches: VecDeque<PackedBatch>,
    pub served: usize,
    pub poison: Option<(usize, Var)>,
}

impl VecSource {
    pub fn new(batches: Vec<PackedBatch>) -> VecSource {
        VecSource {
            batches: batches.into(),
            served: 0,
            poison: None,
        }
    }
}

impl BatchSource for VecSource {
    fn next_batch(&mut self) -> Result<Option<PackedBatch>, SourceError> {
        if let Some((at, var)) = &self.poison
            && *at == self.served
        {
            let nan = (var.as_tensor().zeros_like().unwrap() + f64::NAN).unwrap();
            var.set(&nan).unwrap();
        }
        self.served += 1;
        Ok(self.batches.pop_front())
    }
    fn cursor(&self) -> serde_json::Value {
        serde_json::json!(self.served)
    }
    fn restore(&mut self, cursor: serde_json::Value) -> Result<(), SourceError> {
        let n = cursor.as_u64().unwrap_or(0) as usize;
        for _ in self.served..n {
            self.batches.pop_front();
        }
        self.served = n;
        Ok(())
    }
}

/// A trainer config for the nano preset (hidden 64, 2 layers, vocab 300); `extra` is TOML
/// appended to the file (e.g. `[training]` keys are given through `training`).
pub fn test_config(output_dir: &Path, data: &str, training: &str) -> TrainConfig {
    let text = format!(
        r#"
output_dir = "{}"
[model]
preset = "nano"
vocab_size = {VOCAB}
[data]
kind = "shards"
train = ["unused.shard"]
{data}
[optimizer]
kind = "adamw"
lr = 0.003
[schedule]
kind = "constant"
warmup_steps = 0
[training]
{training}
"#,
        output_dir.display()
    );
    let table: toml::Table = toml::from_str(&text).expect("test config parses");
    let file = ConfigFile::from_table(table, "<test>").expect("test config deserialises");
    TrainConfig::from_file(file, output_dir).expect("test config validates")
}

pub fn nano_model(seed: u64) -> Transformer {
    let json = stoke_train::config::ModelPreset::Nano.config_json(VOCAB, 64);
    let config = stoke_model::ModelConfig::from_json_str(&json.to_string(), Path::new("<nano>"))
        .expect("nano config");
    Transformer::init(config, &Device::Cpu, seed).expect("init")
}

/// Every parameter's gradient in `store` (after a backward pass), flattened, in the model's
/// parameter order.
pub fn gradient_values(
    model: &Transformer,
    store: &candle_core::backprop::GradStore,
) -> Vec<Vec<f32>> {
    model
        .parameters()
        .iter()
        .map(|(_, var)| {
            store
                .get(var.as_tensor())
                .expect("a gradient for every parameter")
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

/// Every parameter's values, in name order.
pub fn parameter_values(model: &Transformer) -> Vec<(String, Vec<f32>)> {
    model
        .parameters()
        .into_iter()
        .map(|(name, var)| {
            (
                name,
                var.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap(),
            )
        })
        .collect()
}

/// Writes `docs` patterned documents (lengths `min_len` up to `min_len + spread - 1`) as token
/// shards into `<dir>/shards`: the data of the tests that run whole training runs.
pub fn write_pattern_shards(dir: &Path, docs: u32, min_len: u32, spread: u32) {
    use stoke_data::shard::{ShardWriter, ShardWriterConfig};
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: dir.join("shards"),
        prefix: "part".into(),
        vocab_size: VOCAB as u64,
        max_tokens_per_shard: 100_000,
    })
    .unwrap();
    for d in 0..docs {
        let doc: Vec<u32> = (0..min_len + d % spread)
            .map(|i| (d * 7 + i * (1 + d % 3)) % VOCAB as u32)
            .collect();
        writer.push_document(&doc).unwrap();
    }
    writer.finish().unwrap();
}

/// The run config of the TOML `base` with `--set` style overrides, relative to `dir`.
pub fn run_config(base: &str, dir: &Path, sets: &[&str]) -> TrainConfig {
    let mut table: toml::Table = toml::from_str(base).unwrap();
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    stoke_train::config::apply_overrides(&mut table, &sets).unwrap();
    TrainConfig::from_file(ConfigFile::from_table(table, "test").unwrap(), dir).unwrap()
}

/// Quiet run options without MFU measurement or report.
pub fn run_options(resume: bool) -> stoke_train::run::RunOptions {
    stoke_train::run::RunOptions {
        resume,
        quiet: true,
        measure_mfu: false,
        write_report: false,
    }
}
