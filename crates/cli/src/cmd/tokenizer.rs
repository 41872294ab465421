//! `stoke tokenizer train|eval` and the token-data commands `stoke data tokenize|stats` (their
//! argument types live here and `cmd/data.rs` routes to them, so the funnel's file stays about
//! the funnel).
//!
//! Input handling is shared: `.jsonl`/`.json`/`.ndjson` files hold one document per line in a
//! `--field` (default `text`); any other file is plain text, one text per line (training and
//! evaluation) or one document per line (`data tokenize`). Bad input (unreadable file, invalid
//! UTF-8, malformed JSON, missing field) is counted and reported with its file and line, and
//! never stops a run unless `--strict` is given.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use stoke_data::shard::{self, ShardReader, ShardWriter, ShardWriterConfig};
use stoke_tokenizer::hf::Tokenizer;
use stoke_tokenizer::metrics::{TokenizerMetrics, WordSegmentation, comparison_table};
use stoke_tokenizer::train::{CorpusReader, CorpusStats, TrainerConfig, WordCounts, train_bpe};

#[derive(Subcommand)]
pub enum TokenizerCommand {
    /// Train a byte-level BPE tokenizer (GPT-4 pre-split pattern) and save tokenizer.json.
    Train(TrainArgs),
    /// Measure fertility, continued words and compression of one or two tokenizers.
    Eval(EvalArgs),
}

#[derive(Args)]
pub struct TrainArgs {
    /// Text or JSONL files.
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    /// Vocabulary size including the 256 bytes and the special tokens.
    #[arg(long)]
    vocab_size: usize,
    /// Directory that receives tokenizer.json.
    #[arg(long)]
    output: PathBuf,
    /// Special tokens, appended after the learned vocabulary.
    #[arg(long, num_args = 0.., default_values_t = [String::from("<|endoftext|>")])]
    special_tokens: Vec<String>,
    /// JSONL field holding the text.
    #[arg(long, default_value = "text")]
    field: String,
    /// Fail on the first bad record instead of skipping it.
    #[arg(long)]
    strict: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum WordsArg {
    Unicode,
    Whitespace,
}

#[derive(Args)]
pub struct EvalArgs {
    /// Tokenizer directory (holding tokenizer.json).
    #[arg(long)]
    tokenizer: PathBuf,
    /// A second tokenizer directory to compare side by side.
    #[arg(long)]
    compare: Option<PathBuf>,
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    #[arg(long, default_value = "text")]
    field: String,
    /// Word segmentation for fertility: Unicode word boundaries (UAX #29) or whitespace.
    #[arg(long, value_enum, default_value = "unicode")]
    words: WordsArg,
    #[arg(long)]
    strict: bool,
}

/// `stoke data tokenize`.
#[derive(Args)]
pub struct DataTokenizeArgs {
    #[arg(long)]
    tokenizer: PathBuf,
    /// JSONL (or text) files of documents.
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    /// Directory that receives the shards.
    #[arg(long)]
    output: PathBuf,
    #[arg(long, default_value = "text")]
    field: String,
    /// Token appended to every document (e.g. "<|endoftext|>"); must be in the vocabulary.
    #[arg(long)]
    eos: Option<String>,
    /// Shard file name prefix.
    #[arg(long, default_value = "shard")]
    prefix: String,
    /// Roll over to a new shard past this many tokens.
    #[arg(long, default_value_t = 100_000_000)]
    max_tokens_per_shard: u64,
    #[arg(long)]
    strict: bool,
}

/// `stoke data stats`.
#[derive(Args)]
pub struct DataStatsArgs {
    /// A shard directory, a .shard file, or JSONL/text files.
    #[arg(num_args = 1.., required = true)]
    paths: Vec<PathBuf>,
    #[arg(long, default_value = "text")]
    field: String,
}

pub fn run(command: TokenizerCommand) -> anyhow::Result<()> {
    match command {
        TokenizerCommand::Train(args) => train(args),
        TokenizerCommand::Eval(args) => eval(args),
    }
}

fn bytes_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(what.to_string());
    bar
}

fn report_bad(stats: &CorpusStats, strict: bool) -> anyhow::Result<()> {
    if stats.bad_records > 0 {
        eprintln!("{} bad records skipped; first ones:", stats.bad_records);
        for bad in &stats.first_bad {
            eprintln!("  {bad}");
        }
        if strict {
            bail!("{} bad records (--strict)", stats.bad_records);
        }
    }
    Ok(())
}

fn train(args: TrainArgs) -> anyhow::Result<()> {
    let config = TrainerConfig::new(args.vocab_size, args.special_tokens.clone());
    config.validate()?;
    let started = Instant::now();
    let mut reader = CorpusReader::new(args.input.clone(), &args.field);
    let bar = bytes_bar(reader.total_bytes(), "counting");
    let mut words = WordCounts::new(&config.pattern)?;
    while let Some(batch) = reader.next_batch(16 << 20) {
        words.add_texts(&batch);
        bar.set_position(reader.stats.bytes);
        if args.strict && reader.stats.bad_records > 0 {
            break;
        }
    }
    bar.finish_and_clear();
    report_bad(&reader.stats, args.strict)?;
    let counted = started.elapsed();
    let merges_bar =
        ProgressBar::new((config.vocab_size - 256 - config.special_tokens.len()) as u64);
    merges_bar.set_style(
        ProgressStyle::with_template("merges {wide_bar} {pos}/{len} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let bpe = train_bpe(&words, &config, |p| {
        merges_bar.set_position(p.merges_done as u64)
    })?;
    merges_bar.finish_and_clear();
    let path = bpe.save(&args.output)?;
    println!(
        "read {} texts ({:.1} MB) from {} files; {} unique pieces; {} merges; vocabulary {} \
         (requested {}); counting {:.1}s, merging {:.1}s",
        reader.stats.texts,
        reader.stats.bytes as f64 / 1e6,
        reader.stats.files,
        words.counts.len(),
        bpe.merges.len(),
        bpe.vocab_size(),
        args.vocab_size,
        counted.as_secs_f64(),
        (started.elapsed() - counted).as_secs_f64()
    );
    if words.split_errors > 0 {
        eprintln!(
            "{} texts could not be fully pre-split (regex backtrack limit)",
            words.split_errors
        );
    }
    println!("wrote {}", path.display());
    Ok(())
}

fn load_tokenizer(dir: &Path) -> anyhow::Result<Tokenizer> {
    Tokenizer::from_dir(dir).with_context(|| format!("loading tokenizer from {}", dir.display()))
}

fn eval(args: EvalArgs) -> anyhow::Result<()> {
    let segmentation = match args.words {
        WordsArg::Unicode => WordSegmentation::UnicodeWords,
        WordsArg::Whitespace => WordSegmentation::Whitespace,
    };
    let mut tokenizers = vec![(args.tokenizer.clone(), load_tokenizer(&args.tokenizer)?)];
    if let Some(other) = &args.compare {
        tokenizers.push((other.clone(), load_tokenizer(other)?));
    }
    let mut metrics = vec![TokenizerMetrics::default(); tokenizers.len()];
    let mut encode_seconds = vec![0.0f64; tokenizers.len()];
    let mut reader = CorpusReader::new(args.input.clone(), &args.field);
    while let Some(batch) = reader.next_batch(4 << 20) {
        for (i, (_, tokenizer)) in tokenizers.iter().enumerate() {
            let started = Instant::now();
            let encoded: Vec<_> = batch
                .par_iter()
                .map(|text| tokenizer.encode_with_offsets(text, false))
                .collect::<Result<_, _>>()?;
            encode_seconds[i] += started.elapsed().as_secs_f64();
            for (text, encoding) in batch.iter().zip(&encoded) {
                metrics[i].add_text(text, encoding.get_offsets(), segmentation);
            }
        }
    }
    report_bad(&reader.stats, args.strict)?;
    let names: Vec<String> = tokenizers
        .iter()
        .map(|(dir, _)| {
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| dir.display().to_string())
        })
        .collect();
    let columns: Vec<(&str, &TokenizerMetrics)> = names
        .iter()
        .map(String::as_str)
        .zip(metrics.iter())
        .collect();
    print!("{}", comparison_table(&columns));
    for (name, (m, seconds)) in names.iter().zip(metrics.iter().zip(&encode_seconds)) {
        println!(
            "{name}: encoding {:.1} MB/s ({} threads)",
            m.bytes as f64 / 1e6 / seconds.max(1e-9),
            rayon::current_num_threads()
        );
    }
    Ok(())
}

/// `stoke data tokenize`: documents to shards.
pub fn data_tokenize(args: DataTokenizeArgs) -> anyhow::Result<()> {
    let tokenizer = load_tokenizer(&args.tokenizer)?;
    let eos = match &args.eos {
        Some(token) => Some(
            tokenizer
                .token_to_id(token)
                .with_context(|| format!("--eos {token:?} is not in the vocabulary"))?,
        ),
        None => None,
    };
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: args.output.clone(),
        prefix: args.prefix.clone(),
        vocab_size: tokenizer.vocab_size() as u64,
        max_tokens_per_shard: args.max_tokens_per_shard,
    })?;
    let mut reader = CorpusReader::new(args.input.clone(), &args.field);
    let bar = bytes_bar(reader.total_bytes(), "tokenizing");
    let started = Instant::now();
    let (mut docs, mut tokens, mut failed) = (0u64, 0u64, 0u64);
    while let Some(batch) = reader.next_batch(8 << 20) {
        let encoded: Vec<_> = batch
            .par_iter()
            .map(|text| tokenizer.encode(text, false))
            .collect();
        for result in encoded {
            match result {
                Ok(mut ids) => {
                    ids.extend(eos);
                    if ids.len() as u64 > args.max_tokens_per_shard {
                        failed += 1;
                        eprintln!(
                            "skipped a document of {} tokens (over --max-tokens-per-shard)",
                            ids.len()
                        );
                        continue;
                    }
                    tokens += ids.len() as u64;
                    docs += 1;
                    writer.push_document(&ids)?;
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("encoding failed: {e}");
                }
            }
        }
        bar.set_position(reader.stats.bytes);
        if args.strict && (reader.stats.bad_records > 0 || failed > 0) {
            break;
        }
    }
    bar.finish_and_clear();
    report_bad(&reader.stats, args.strict)?;
    if args.strict && failed > 0 {
        bail!("{failed} documents failed to encode (--strict)");
    }
    let shards = writer.finish()?;
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    println!(
        "{docs} documents, {tokens} tokens into {} shards in {}; {:.1} MB/s; {failed} failed",
        shards.len(),
        args.output.display(),
        reader.stats.bytes as f64 / 1e6 / seconds
    );
    Ok(())
}

/// `stoke data stats`.
pub fn data_stats(args: DataStatsArgs) -> anyhow::Result<()> {
    let mut shard_paths = Vec::new();
    let mut text_paths = Vec::new();
    for path in &args.paths {
        if path.is_dir() {
            shard_paths.extend(shard::list_shards(path)?);
        } else if path.extension().and_then(|e| e.to_str()) == Some(shard::EXTENSION) {
            shard_paths.push(path.clone());
        } else {
            text_paths.push(path.clone());
        }
    }
    if !shard_paths.is_empty() {
        shard_stats(&shard_paths);
    }
    if !text_paths.is_empty() {
        let mut reader = CorpusReader::new(text_paths, &args.field);
        let mut longest = 0usize;
        while let Some(batch) = reader.next_batch(8 << 20) {
            longest = longest.max(batch.iter().map(String::len).max().unwrap_or(0));
        }
        let s = &reader.stats;
        println!(
            "documents: {} ({} files, {} bytes read, longest {} bytes), bad records: {}",
            s.texts, s.files, s.bytes, longest, s.bad_records
        );
        for bad in &s.first_bad {
            println!("  bad: {bad}");
        }
    }
    if shard_paths.is_empty() && args.paths.iter().all(|p| p.is_dir()) {
        bail!("no .shard files found");
    }
    Ok(())
}

fn shard_stats(paths: &[PathBuf]) {
    let mut lengths: Vec<u64> = Vec::new();
    let (mut tokens, mut good, mut bad) = (0u64, 0u64, 0u64);
    let mut widths = std::collections::BTreeSet::new();
    for path in paths {
        match ShardReader::open(path) {
            Ok(shard) => {
                good += 1;
                tokens += shard.num_tokens();
                widths.insert(format!(
                    "{:?} (vocab {})",
                    shard.width(),
                    shard.vocab_size()
                ));
                lengths.extend(
                    (0..shard.num_docs())
                        .filter_map(|d| shard.doc_len(d))
                        .map(|l| l as u64),
                );
            }
            Err(e) => {
                bad += 1;
                println!("bad shard: {e}");
            }
        }
    }
    lengths.sort_unstable();
    let docs = lengths.len() as u64;
    println!(
        "shards: {good} valid, {bad} invalid; tokens: {}",
        widths.into_iter().collect::<Vec<_>>().join(", ")
    );
    println!(
        "documents: {docs}, tokens: {tokens}, mean length {:.1}",
        tokens as f64 / docs.max(1) as f64
    );
    if docs > 0 {
        let q = |f: f64| lengths[((docs - 1) as f64 * f).round() as usize];
        println!(
            "length min {} p50 {} p90 {} p99 {} max {}",
            q(0.0),
            q(0.5),
            q(0.9),
            q(0.99),
            q(1.0)
        );
        println!("length histogram (tokens, power-of-two buckets):");
        let mut buckets: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        for &l in &lengths {
            *buckets
                .entry(if l == 0 { 0 } else { 64 - l.leading_zeros() })
                .or_default() += 1;
        }
        let most = buckets.values().copied().max().unwrap_or(1);
        for (bucket, count) in buckets {
            let (lo, hi) = if bucket == 0 {
                (0, 0)
            } else {
                (1u64 << (bucket - 1), (1u64 << bucket) - 1)
            };
            let bar = "#".repeat(((count * 40).div_ceil(most)) as usize);
            println!("  {lo:>8}-{hi:<8} {count:>10} {bar}");
        }
    }
}
