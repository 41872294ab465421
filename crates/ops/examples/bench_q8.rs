//! Microbenchmark of the Q8_0 decode kernel (`stoke_ops::quant`): one Q8_0 weight matrix
//! `[rows, cols]` against `batch` input rows, on the calling thread, `reps` times, for every
//! kernel path this CPU has; then the same shape through the bf16 `matvec` for comparison.
//! GB/s counts the weight bytes each kernel reads per pass (34 per 32 Q8_0 weights, 2 per bf16
//! weight); GFLOP/s counts 2 per weight and input row. The inputs' quantization is outside the
//! timing (once per call in use, as the bf16 inputs' preparation).
//!
//! Run: `cargo run --release -p stoke-ops --example bench_q8 -- ROWS COLS BATCH REPS`
//! e.g. `512 576 8 4000` (in L2) and `49152 576 1 40` (SmolLM2's LM head, from memory).

use std::time::Instant;
use stoke_ops::bf16::PackedA;
use stoke_ops::matvec::{Inputs, matvec};
use stoke_ops::quant::{Q8Inputs, Q8Kernel, Q8Matrix, q8_matvec_with};

fn report(kernel: &str, rows: usize, cols: usize, batch: usize, bytes: usize, seconds: f64) {
    println!(
        "{{\"kernel\": \"{kernel}\", \"rows\": {rows}, \"cols\": {cols}, \"batch\": {batch}, \
         \"gflops\": {:.1}, \"weight_gb_per_s\": {:.1}, \"us_per_call\": {:.1}}}",
        (2 * rows * cols * batch) as f64 / seconds / 1e9,
        bytes as f64 / seconds / 1e9,
        seconds * 1e6
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()?;
    let [rows, cols, batch, reps] = args[..] else {
        return Err("usage: bench_q8 ROWS COLS BATCH REPS".into());
    };
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i % 977) as f32) * 1e-3 - 0.4)
        .collect();
    let x: Vec<f32> = (0..batch * cols)
        .map(|i| ((i % 13) as f32) * 0.1 - 0.6)
        .collect();
    let mut out = vec![0f32; batch * rows];

    let q8 = Q8Matrix::quantize(&w, rows, cols);
    let mut q8_inputs = Q8Inputs::new();
    q8_inputs.prepare(&x, batch, cols);
    q8_inputs.stream_weights(q8.bytes() > 32 << 20);
    for kernel in Q8Kernel::ALL {
        if !kernel.available() {
            eprintln!("skipped: {} not available on this CPU", kernel.name());
            continue;
        }
        q8_matvec_with(kernel, &q8, &q8_inputs, 0..rows, &mut out, rows);
        let start = Instant::now();
        for _ in 0..reps {
            q8_matvec_with(kernel, &q8, &q8_inputs, 0..rows, &mut out, rows);
        }
        let seconds = start.elapsed().as_secs_f64() / reps as f64;
        let name = format!("q8_0 {}", kernel.name());
        report(&name, rows, cols, batch, q8.bytes(), seconds);
    }

    let packed = PackedA::from_rows(&w, rows, cols);
    let weights = packed.weights();
    let mut inputs = Inputs::new();
    inputs.prepare(&x, batch, cols, true);
    inputs.stream_weights(weights.bytes() > 32 << 20);
    matvec(&weights, &inputs, 0..rows, &mut out, rows);
    let start = Instant::now();
    for _ in 0..reps {
        matvec(&weights, &inputs, 0..rows, &mut out, rows);
    }
    let seconds = start.elapsed().as_secs_f64() / reps as f64;
    let name = format!("bf16 {}", stoke_ops::matvec::kernel().name());
    report(&name, rows, cols, batch, weights.bytes(), seconds);
    Ok(())
}
