//! The machine's memory-read ceiling, the denominator of the batch-1 decode target ("at least 80%
//! of the memory-bandwidth ceiling for the weight precision used").
//!
//! Plain read loops over a buffer far larger than the caches, filled with distinct pseudo-random
//! words (a repeating pattern can be merged into shared pages by the hypervisor, and then reads
//! hit the cache), split between `THREADS` threads. Each thread reads its share as 1, 4 or 8
//! sequential streams, with software prefetches 0, 256 or 1,024 bytes ahead; each configuration
//! runs `REPS` times. Prints every configuration's best GB/s and the best of all: the fastest
//! read loop found is the ceiling. With `--bytes-per-token N` it also prints the batch-1 decode
//! ceiling in tokens/s (every weight byte read once a token). Not a test.
//!
//! ```text
//! cargo build --release -p stoke-ops --example bench_bandwidth
//! target/release/examples/bench_bandwidth [--threads 2] [--mib 1024] [--reps 5] [--bytes-per-token N]
//! ```
//!
//! On a shared VM the figure moves with the neighbours' load (28-48 GB/s on the same 2-vCPU Zen 4
//! within a day), so the decode figure it divides must be measured next to it, in alternation.

// `unsafe` only for the prefetch hint.
#![allow(unsafe_code)]

use std::time::Instant;

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

/// A hint to fetch the line at `p`; valid for any address.
#[inline(always)]
fn prefetch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// XOR of every word of `share`, read as `streams` sequential parts in lockstep, one cache line
/// (8 words) of each part per round, prefetching `ahead` bytes on in each part.
fn read(share: &[u64], streams: usize, ahead: usize) -> u64 {
    let part = share.len() / streams / 8 * 8;
    let mut acc = [0u64; 8];
    let ahead_words = ahead / 8;
    for i in (0..part).step_by(8) {
        for s in 0..streams {
            let at = s * part + i;
            if ahead_words > 0 {
                prefetch(share.as_ptr().wrapping_add(at + ahead_words));
            }
            let line = &share[at..at + 8];
            for (a, &w) in acc.iter_mut().zip(line) {
                *a ^= w;
            }
        }
    }
    acc.iter().fold(0, |x, &a| x ^ a)
}

fn main() -> Result<(), String> {
    let args = parse()?;
    let words = args.mib << 17;
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let buffer: Vec<u64> = (0..words)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        })
        .collect();
    let share = words / args.threads;
    let mut best_all = 0f64;
    let mut check = 0u64;
    for streams in [1usize, 4, 8] {
        for ahead in [0usize, 256, 1024] {
            let mut best = 0f64;
            for _ in 0..args.reps {
                let start = Instant::now();
                let sums: Vec<u64> = std::thread::scope(|scope| {
                    let handles: Vec<_> = buffer
                        .chunks(share)
                        .take(args.threads)
                        .map(|part| scope.spawn(move || read(part, streams, ahead)))
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
                });
                let seconds = start.elapsed().as_secs_f64();
                check ^= sums.iter().fold(0, |x, &s| x ^ s);
                best = best.max((share * args.threads * 8) as f64 / seconds / 1e9);
            }
            println!(
                "{{\"threads\": {}, \"streams\": {streams}, \"prefetch_bytes\": {ahead}, \"gb_per_s\": {best:.1}}}",
                args.threads
            );
            best_all = best_all.max(best);
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
