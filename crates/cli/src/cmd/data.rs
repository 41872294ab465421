//! `stoke data ...`: the data funnel from the command line.
//!
//! `stoke data run CONFIG.toml` reads the funnel config (relative paths in it are taken from the
//! config file's folder), runs it with a progress bar (documents/s, MB/s), and prints the
//! per-stage summary; the full report lands in `run.report_dir`. With a `[tokenize]` table the
//! kept documents also become token shards, encoded by the `tokenizer.json` it names.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use stoke_data::funnel::{self, DocumentTokenizer, FunnelFile, FunnelReport, Progress};

#[derive(Subcommand)]
pub enum DataCommand {
    /// Run the data funnel described by a TOML file.
    Run { config: PathBuf },
    /// Tokenize documents (JSONL) into token shards.
    Tokenize(crate::cmd::tokenizer::DataTokenizeArgs),
    /// Documents, tokens and a length histogram of shards; documents and bytes of JSONL files.
    Stats(crate::cmd::tokenizer::DataStatsArgs),
    /// Each document's verdict and rule numbers under the Gopher quality, Gopher repetition, C4
    /// and FineWeb filters (each alone, defaults), as JSONL: the input of
    /// `scripts/funnel_agreement.py`, which sets them beside datatrove's.
    Verdicts {
        /// JSONL with a string `text` field (and an `id`, copied through).
        #[arg(long)]
        input: PathBuf,
        /// Where the verdicts go, one line per document in input order.
        #[arg(long)]
        output: PathBuf,
    },
}

pub fn run(command: DataCommand) -> anyhow::Result<()> {
    match command {
        DataCommand::Run { config } => run_funnel(&config),
        DataCommand::Tokenize(args) => crate::cmd::tokenizer::data_tokenize(args),
        DataCommand::Stats(args) => crate::cmd::tokenizer::data_stats(args),
        DataCommand::Verdicts { input, output } => {
            let n =
                funnel::verdicts::write_verdicts(&input, &output).map_err(anyhow::Error::msg)?;
            println!("{n} documents -> {}", output.display());
            Ok(())
        }
    }
}

fn run_funnel(config: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config)
        .with_context(|| format!("cannot read funnel config {}", config.display()))?;
    let base_dir = config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let plan = FunnelFile::parse(&text)
        .and_then(|file| file.validate(base_dir))
        .with_context(|| format!("in {}", config.display()))?;
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let started = Instant::now();
    let on_progress = |p: &Progress| {
        let seconds = started.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!(
            "{} docs read, {} kept, {} bad | {:.0} docs/s, {:.1} MB/s",
            p.documents_read,
            p.documents_kept,
            p.bad_records,
            p.documents_read as f64 / seconds,
            p.bytes_read as f64 / 1e6 / seconds
        ));
    };
    let tokenizer = match &plan.tokenize {
        Some(settings) => Some(HfDocumentTokenizer::load(
            &settings.tokenizer,
            &settings.end_of_text,
        )?),
        None => None,
    };
    let report = funnel::run(
        plan,
        tokenizer.as_ref().map(|t| t as &dyn DocumentTokenizer),
        &on_progress,
    )?;
    bar.finish_and_clear();
    print!("{}", summary(&report));
    Ok(())
}

/// The `[tokenize]` step's tokenizer: a Hugging Face `tokenizer.json` folder.
struct HfDocumentTokenizer {
    inner: stoke_tokenizer::hf::Tokenizer,
    end_of_text: u32,
    vocab_size: u64,
}

impl HfDocumentTokenizer {
    fn load(dir: &Path, end_of_text: &str) -> anyhow::Result<Self> {
        let inner = stoke_tokenizer::hf::Tokenizer::from_dir(dir)
            .with_context(|| format!("[tokenize] tokenizer {}", dir.display()))?;
        let end_id = inner.token_to_id(end_of_text).with_context(|| {
            format!(
                "[tokenize] tokenizer {} has no token {end_of_text:?}",
                dir.display()
            )
        })?;
        let vocab_size = (inner.vocab_size() as u64).max(u64::from(end_id) + 1);
        Ok(HfDocumentTokenizer {
            inner,
            end_of_text: end_id,
            vocab_size,
        })
    }
}

impl DocumentTokenizer for HfDocumentTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.inner.encode(text, false).map_err(|e| e.to_string())
    }
    fn vocab_size(&self) -> u64 {
        self.vocab_size
    }
    fn end_of_text(&self) -> u32 {
        self.end_of_text
    }
}

/// The per-stage table printed at the end of a run.
fn summary(report: &FunnelReport) -> String {
    let mut out = String::new();
    let input = &report.input;
    out.push_str(&format!(
        "input: {} documents, {:.1} MB from {} files, {} bad records\n",
        input.documents,
        input.bytes as f64 / 1e6,
        input.files,
        input.bad_records
    ));
    for bad in input.bad_record_examples.iter().take(5) {
        out.push_str(&format!("  bad: {}: {}\n", bad.location, bad.error));
    }
    out.push_str(&format!(
        "{:<20} {:>10} {:>10} {:>8} {:>8}  removed by reason\n",
        "stage", "in", "out", "kept%", "cpu s"
    ));
    for stage in &report.stages {
        let pct = 100.0 * stage.documents_out as f64 / stage.documents_in.max(1) as f64;
        let reasons: Vec<String> = stage
            .removed
            .iter()
            .map(|(r, n)| format!("{r}={n}"))
            .collect();
        let events: Vec<String> = stage
            .events
            .iter()
            .map(|(e, n)| format!("{e}={n}"))
            .collect();
        out.push_str(&format!(
            "{:<20} {:>10} {:>10} {:>7.1}% {:>8.2}  {}{}\n",
            stage.name,
            stage.documents_in,
            stage.documents_out,
            pct,
            stage.cpu_seconds,
            reasons.join(" "),
            if events.is_empty() {
                String::new()
            } else {
                format!(" [{}]", events.join(" "))
            }
        ));
    }
    out.push_str(&format!(
        "output: {} documents, {:.1} MB -> {}\n",
        report.output.documents,
        report.output.bytes as f64 / 1e6,
        report.output.path
    ));
    if let Some(tokenized) = &report.tokenized {
        out.push_str(&format!(
            "tokenized: {} documents, {} tokens in {} shards\n",
            tokenized.documents,
            tokenized.tokens,
            tokenized.shards.len()
        ));
    }
    out.push_str(&format!(
        "{:.1} s on {} threads: {:.0} docs/s, {:.1} MB/s\n",
        report.wall_seconds,
        report.threads,
        report.documents_per_second,
        report.megabytes_per_second
    ));
    out
}
