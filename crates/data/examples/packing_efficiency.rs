//! Packing efficiency on synthetic lognormal document lengths:
//! `cargo run --release -p stoke-data --example packing_efficiency`. Prints, for each policy and
//! length mix, the fraction of row slots holding real tokens and the number of split documents.

use stoke_data::packing::{Packer, PackingPolicy};

fn lognormal_lengths(seed: u64, n: usize, median: f64, sigma: f64) -> Vec<usize> {
    let mut state = seed;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u1, u2) = (uniform(), uniform());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            ((median * (sigma * z).exp()) as usize).max(1)
        })
        .collect()
}

fn main() {
    let seq_len = 2048;
    println!("seq_len {seq_len}; 50k documents per mix");
    println!(
        "{:<46} {:>12} {:>10} {:>9}",
        "policy", "median/sigma", "efficiency", "splits"
    );
    for (median, sigma) in [(300.0, 1.0), (600.0, 1.0), (1500.0, 1.2), (4000.0, 1.0)] {
        let lengths = lognormal_lengths(42, 50_000, median, sigma);
        for policy in [
            PackingPolicy::ConcatChunk,
            PackingPolicy::BestFitDecreasing { window_docs: 1000 },
            PackingPolicy::BestFitDecreasing {
                window_docs: 10_000,
            },
            PackingPolicy::BestFitDecreasingSplit { window_docs: 1000 },
        ] {
            let mut packer = Packer::new(policy, seq_len);
            for (doc, &len) in lengths.iter().enumerate() {
                packer.push_document(doc as u64, len);
                while packer.pop_row().is_some() {}
            }
            packer.flush();
            let stats = packer.stats();
            println!(
                "{:<46} {:>12} {:>9.3}% {:>9}",
                format!("{policy:?}"),
                format!("{median}/{sigma}"),
                100.0 * stats.efficiency(),
                stats.splits
            );
        }
    }
}
