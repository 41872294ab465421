//! Memory and time of indexing a large training corpus for n-gram contamination checks.
//!
//! `cargo run --release -p stoke-eval --example contamination_index -- [MB] [jsonl|txt] [DIR]`
//! writes MB megabytes (default 1024) of random-word documents to a temporary file in DIR
//! (default the system temp folder), streamed to disk, indexes it with 13-grams and prints the
//! distinct n-grams, seconds and the process's peak RSS (VmHWM). The file is deleted at the end.
//! Random words make every 13-gram distinct: the worst case for memory.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stoke_eval::contamination::{IndexConfig, check, index_files};

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    kb / 1024.0
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let megabytes: u64 = args.first().map_or(Ok(1024), |a| a.parse())?;
    let txt = args.get(1).is_some_and(|a| a == "txt");
    let dir = args.get(2).map_or_else(std::env::temp_dir, PathBuf::from);

    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let vocabulary: Vec<String> = (0..50_000)
        .map(|_| {
            let len = rng.random_range(2..11);
            (0..len)
                .map(|_| rng.random_range(b'a'..=b'z') as char)
                .collect()
        })
        .collect();
    let suffix = if txt { ".txt" } else { ".jsonl" };
    let file = tempfile::Builder::new().suffix(suffix).tempfile_in(&dir)?;
    let started = Instant::now();
    let (mut written, mut words) = (0u64, 0u64);
    let mut planted = String::new();
    {
        let mut out = BufWriter::with_capacity(1 << 20, file.as_file());
        let mut document = String::new();
        while written < megabytes << 20 {
            document.clear();
            for i in 0..300 {
                if i > 0 {
                    document.push(' ');
                }
                document.push_str(vocabulary.choose(&mut rng).map_or("", String::as_str));
            }
            words += 300;
            if planted.is_empty() {
                planted = document
                    .split(' ')
                    .skip(100)
                    .take(20)
                    .collect::<Vec<_>>()
                    .join(" ");
            }
            let line = if txt {
                format!("{document}\n")
            } else {
                format!("{}\n", serde_json::json!({ "text": document }))
            };
            out.write_all(line.as_bytes())?;
            written += line.len() as u64;
        }
        out.flush()?;
    }
    println!(
        "wrote {:.0} MB ({words} words) to {} in {:.1} s; peak RSS so far {:.0} MB",
        written as f64 / (1 << 20) as f64,
        file.path().display(),
        started.elapsed().as_secs_f64(),
        peak_rss_mb()
    );

    let started = Instant::now();
    let index = index_files(
        &[file.path().to_path_buf()],
        &IndexConfig::default(),
        "text",
    )?;
    let seconds = started.elapsed().as_secs_f64();
    let unrelated: Vec<String> = (0..20).map(|i| format!("unrelatedword{i}")).collect();
    assert!(
        check(&index, &planted).contaminated(),
        "a corpus passage must be found"
    );
    assert!(!check(&index, &unrelated.join(" ")).contaminated());
    println!(
        "indexed {} documents: {} n-grams, {} distinct ({:.0} MB table) in {seconds:.1} s \
         ({:.0} MB/s); peak RSS {:.0} MB",
        index.documents(),
        index.ngrams_seen(),
        index.len(),
        index.memory_bytes() as f64 / (1 << 20) as f64,
        written as f64 / (1 << 20) as f64 / seconds,
        peak_rss_mb()
    );
    file.close()?;
    Ok(())
}
