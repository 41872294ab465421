//! bf16 GEMM throughput (`stoke_ops::bf16`) against candle's f32 matmul on the linear-layer
//! shapes of SmolLM2-135M (hidden 576, intermediate 1536, vocab 49152) at training size
//! (2048 rows) and decoding size (1 and 8 rows). Prints one line per shape: GFLOP/s of each
//! and, for the bf16 kernel, the time spent packing the operands. Not a test.
//!
//! ```text
//! cargo run --release -p stoke-ops --example bench_bf16
//! ```
use std::time::Instant;

use candle_core::{Device, Tensor};
use stoke_ops::bf16::{PackedA, PackedB, backend, matmul_into};

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i as f32) * 0.37).sin()).collect()
}

fn best<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> candle_core::Result<()> {
    println!("bf16 kernel: {}", backend().name());
    for &(m, n, k) in &[
        (2048, 576, 576),
        (2048, 1536, 576),
        (2048, 576, 1536),
        (2048, 192, 576),
        (576, 576, 2048),
        (2048, 8192, 576),
        (320, 49152, 576),
        (320, 576, 49152),
        (576, 49152, 320),
        (8, 576, 576),
        (8, 1536, 576),
        (8, 49152, 576),
        (1, 1536, 576),
        (1, 49152, 576),
    ] {
        let a = values(m * k);
        let b = values(n * k);
        let flop = 2.0 * (m * n * k) as f64;
        let reps = if m * n * k > 100_000_000 { 5 } else { 50 };
        let pb = PackedB::from_rows(&b, n, k);
        let pack = best(reps, || {
            let _ = PackedA::from_rows(&a, m, k);
        });
        let pa = PackedA::from_rows(&a, m, k);
        // C is reused, as the training products reuse theirs (a fresh buffer would time page
        // faults, not the kernel).
        let mut c = vec![0.0f32; m * n];
        let kernel = best(reps, || matmul_into(&pa, &pb, &mut c));
        let pack_b = best(reps, || {
            let _ = PackedB::from_rows(&b, n, k);
        });
        let ta = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu)?;
        let tb = Tensor::from_vec(b.clone(), (n, k), &Device::Cpu)?;
        let f32_time = best(reps, || {
            let _ = ta.matmul(&tb.t().unwrap()).unwrap();
        });
        println!(
            "{m:>5} x {n:>5} x {k:>5}: bf16 {:>7.1} GFLOP/s (pack A {:.2} ms, pack B {:.2} ms, kernel {:.3} ms); f32 candle {:>7.1} GFLOP/s",
            flop / kernel / 1e9,
            pack * 1e3,
            pack_b * 1e3,
            kernel * 1e3,
            flop / f32_time / 1e9
        );
    }
    Ok(())
}
