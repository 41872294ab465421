//! Training benchmark: `cargo run --release -p stoke-tokenizer --example train_bench -- \
//!   (stoke|reference) CORPUS VOCAB_SIZE [OUT_DIR]`. Run it under `/usr/bin/time -v` for peak
//! memory. Both trainers read the same lines through `CorpusReader`; the report gives the
//! counting and merging time of stoke's trainer and the total time of each.

use std::path::PathBuf;
use std::time::Instant;

use stoke_tokenizer::train::{CorpusReader, TrainerConfig, WordCounts, reference_train, train_bpe};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: train_bench (stoke|reference) CORPUS VOCAB_SIZE [OUT_DIR]".into());
    }
    let (which, corpus, vocab_size) =
        (&args[1], PathBuf::from(&args[2]), args[3].parse::<usize>()?);
    let out = args.get(4).map(PathBuf::from);
    let config = TrainerConfig::new(vocab_size, vec!["<|endoftext|>".into()]);
    let started = Instant::now();
    let mut reader = CorpusReader::new(vec![corpus], "text");
    match which.as_str() {
        "stoke" => {
            let mut words = WordCounts::new(&config.pattern)?;
            while let Some(batch) = reader.next_batch(16 << 20) {
                words.add_texts(&batch);
            }
            let counted = started.elapsed();
            let bpe = train_bpe(&words, &config, |_| {})?;
            let total = started.elapsed();
            println!(
                "stoke: {} bytes, {} unique pieces, count {:.2}s, merges {:.2}s, total {:.2}s, {} merges",
                reader.stats.bytes,
                words.counts.len(),
                counted.as_secs_f64(),
                (total - counted).as_secs_f64(),
                total.as_secs_f64(),
                bpe.merges.len()
            );
            if let Some(out) = out {
                bpe.save(&out)?;
            }
        }
        "reference" => {
            let texts = std::iter::from_fn(move || reader.next_batch(16 << 20)).flatten();
            let tokenizer = reference_train(&config, texts)?;
            println!(
                "reference: total {:.2}s, vocab {}",
                started.elapsed().as_secs_f64(),
                tokenizer.get_vocab_size(true)
            );
            if let Some(out) = out {
                std::fs::create_dir_all(&out)?;
                tokenizer
                    .save(out.join("tokenizer.json"), true)
                    .map_err(|e| e.to_string())?;
            }
        }
        other => return Err(format!("unknown trainer {other}").into()),
    }
    Ok(())
}
