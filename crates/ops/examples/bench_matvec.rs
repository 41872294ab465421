//! Microbenchmark of the decode kernels (`stoke_ops::matvec`): one bf16 weight matrix
//! `[rows, cols]` against `batch` input rows, on the calling thread, `reps` times. A small matrix
//! stays in L2 (the kernel's arithmetic rate); a large one streams from memory (its bandwidth).
//!
//! Run: `cargo run --release -p stoke-ops --example bench_matvec -- ROWS COLS BATCH REPS`
//! e.g. `512 576 8 4000` (L2) and `49152 576 8 40` (SmolLM2's LM head, from memory).

use std::time::Instant;
use stoke_ops::bf16::PackedA;
use stoke_ops::matvec::{Inputs, kernel, matvec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()?;
    let [rows, cols, batch, reps] = args[..] else {
        return Err("usage: bench_matvec ROWS COLS BATCH REPS".into());
    };
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i % 977) as f32) * 1e-3)
        .collect();
    let packed = PackedA::from_rows(&w, rows, cols);
    let x: Vec<f32> = (0..batch * cols).map(|i| ((i % 13) as f32) * 0.1).collect();
    let mut inputs = Inputs::new();
    inputs.prepare(&x, batch, cols, true);
    let mut out = vec![0f32; batch * rows];
    let weights = packed.weights();
    matvec(&weights, &inputs, 0..rows, &mut out, rows);
    let start = Instant::now();
    for _ in 0..reps {
        matvec(&weights, &inputs, 0..rows, &mut out, rows);
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{{\"kernel\": \"{}\", \"rows\": {rows}, \"cols\": {cols}, \"batch\": {batch}, \"gflops\": {:.1}, \"weight_gb_per_s\": {:.1}}}",
        kernel().name(),
        (2 * rows * cols * batch * reps) as f64 / seconds / 1e9,
        (2 * rows * cols * reps) as f64 / seconds / 1e9
    );
    Ok(())
}
