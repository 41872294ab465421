//! The machine's memory-read ceiling, the denominator of the batch-1 decode target ("at least 80%
//! of the memory-bandwidth ceiling for the weight precision used"), from `stoke_ops::bandwidth`.
//!
//! Plain read loops over a buffer far larger than the caches (distinct pseudo-random words), on
//! ordinary 4 KiB pages and on 2 MiB huge pages (where the decode step keeps its bf16 weights),
//! split between `THREADS` threads. Each thread reads its share as 1, 4 or 8 sequential
//! streams, with software prefetches 0, 256 or 1,024 bytes ahead; each configuration runs
//! `REPS` times. Prints every configuration's best GB/s and the best of all: the fastest read
//! loop found is the ceiling. With `--bytes-per-token N` it also prints the batch-1 decode
//! ceiling in tokens/s (every weight byte read once a token). Not a test.
//!
//! ```text
//! cargo build --release -p stoke-ops --example bench_bandwidth
//! target/release/examples/bench_bandwidth [--threads 2] [--mib 1024] [--reps 5] [--bytes-per-token N]
//! ```
//!
//! On a shared VM the figure moves with the neighbours' load (25-60 GB/s on the same 2-vCPU Zen 4
//! within an hour), so a decode figure must be divided by a ceiling measured in alternation with
//! it: `bench_decode_share` (stoke-rollout) does that in one process.

use stoke_ops::bandwidth::{ReadBuffer, read_gb_per_s};

struct Args {
    threads: usize,
    mib: usize,
    reps: usize,
    bytes_per_token: Option<f64>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        threads: 2,
        mib: 1024,
        reps: 5,
        bytes_per_token: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .parse::<f64>()
            .map_err(|e| format!("{flag}: {e}"))?;
        match flag.as_str() {
            "--threads" => args.threads = (value as usize).max(1),
            "--mib" => args.mib = (value as usize).max(64),
            "--reps" => args.reps = (value as usize).max(1),
            "--bytes-per-token" => args.bytes_per_token = Some(value),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

fn main() -> Result<(), String> {
    let args = parse()?;
    let mut best_all = 0f64;
    let mut check = 0u64;
    for huge in [false, true] {
        let buffer = ReadBuffer::new(args.mib, huge);
        if huge && !buffer.is_huge() {
            println!(
                "{{\"pages\": \"2m\", \"skipped\": \"no huge-page regions on this platform\"}}"
            );
            continue;
        }
        let pages = if huge { "2m" } else { "4k" };
        for streams in [1usize, 4, 8] {
            for ahead in [0usize, 256, 1024] {
                let mut best = 0f64;
                for _ in 0..args.reps {
                    let (gb, c) = read_gb_per_s(&buffer, args.threads, streams, ahead);
                    best = best.max(gb);
                    check ^= c;
                }
                println!(
                    "{{\"pages\": \"{pages}\", \"threads\": {}, \"streams\": {streams}, \"prefetch_bytes\": {ahead}, \"gb_per_s\": {best:.1}}}",
                    args.threads
                );
                best_all = best_all.max(best);
            }
        }
    }
    let ceiling = args
        .bytes_per_token
        .map(|b| {
            format!(
                ", \"batch1_tokens_per_s_ceiling\": {:.1}",
                best_all * 1e9 / b
            )
        })
        .unwrap_or_default();
    println!(
        "{{\"best_gb_per_s\": {best_all:.1}{ceiling}, \"mib\": {}, \"check\": {}}}",
        args.mib,
        check & 0xff
    );
    Ok(())
}
