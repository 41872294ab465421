//! Optimizer-step micro-benchmark on the parameter shapes of the fixed benchmark model
//! (bench/bench_config.json: vocab 4096, hidden 256, 4 layers, 4 heads / 2 kv heads of 64,
//! MLP 688, untied head; about 5.0M parameters). Prints median ms per step for:
//! - AdamW as stoke-optim runs it (one fused rayon pass per parameter, in place),
//! - the same AdamW written as candle tensor ops (the alternative this crate measured against),
//! - Muon (hidden matrices; AdamW for the rest),
//! - global-norm clipping.
//!
//! Not a test: timings depend on the machine and its load.
//!
//! ```text
//! CARGO_TARGET_DIR=target-optim cargo run --release -p stoke-optim --example step_bench
//! ```
//!
//! Measured 2026-11-30 01:00 UTC, release build, RAYON_NUM_THREADS=2, on the 2-core AMD EPYC
//! (AVX-512) development machine under heavy load (load average 11-12), three runs:
//! AdamW fused 3.7-10.5 ms; the same AdamW as candle tensor ops 340-540 ms (hence the fused
//! loops); Muon 85-188 ms (17.7 GFLOP of Newton-Schulz per step at 94-209 GFLOP/s, against
//! 229 GFLOP/s for a single 256x688x256 matmul); clipping 4.5-10 ms. For scale: one training
//! step of the same model at 8 x 256 tokens took 2-3 s on that machine (bench/README.md), so
//! AdamW costs well under 1% of a step and Muon about 3-9%. Muon's cost does not grow with the
//! batch, so its share shrinks as tokens per step grow.

use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use stoke_optim::{AdamWConfig, MuonConfig, Optimizer, OptimizerConfig, clip_grad_norm};

const REPEATS: usize = 15;

fn shapes() -> Vec<(String, Vec<usize>)> {
    let (vocab, hidden, layers, q, kv, mlp) = (4096, 256, 4, 4 * 64, 2 * 64, 688);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![vocab, hidden])];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![hidden]));
        out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, hidden]));
        out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, hidden]));
        out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, hidden]));
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![hidden, q]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![hidden]));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![mlp, hidden]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![mlp, hidden]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![hidden, mlp]));
    }
    out.push(("model.norm.weight".to_string(), vec![hidden]));
    out.push(("lm_head.weight".to_string(), vec![vocab, hidden]));
    out
}

fn params() -> candle_core::Result<Vec<(String, Var)>> {
    shapes()
        .into_iter()
        .map(|(name, shape)| {
            let t = Tensor::randn(0f32, 0.02, shape.as_slice(), &Device::Cpu)?;
            Ok((name, Var::from_tensor(&t)?))
        })
        .collect()
}

fn grads(params: &[(String, Var)]) -> candle_core::Result<Vec<Tensor>> {
    params
        .iter()
        .map(|(_, v)| Tensor::randn(0f32, 1e-3, v.dims(), &Device::Cpu))
        .collect()
}

fn median_ms(mut run: impl FnMut()) -> f64 {
    run(); // warm-up (first-touch of state pages)
    let mut times: Vec<f64> = (0..REPEATS)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[REPEATS / 2]
}

/// AdamW written with candle tensor ops (no weight-decay groups; the arithmetic is the point).
struct TensorOpAdamW {
    moments: Vec<(Tensor, Tensor)>,
    step: i32,
}

impl TensorOpAdamW {
    fn step(
        &mut self,
        params: &[(String, Var)],
        grads: &[Tensor],
        c: &AdamWConfig,
    ) -> candle_core::Result<()> {
        self.step += 1;
        let bc1 = 1.0 - c.beta1.powi(self.step);
        let bc2 = 1.0 - c.beta2.powi(self.step);
        for (((_, p), g), (m, v)) in params.iter().zip(grads).zip(self.moments.iter_mut()) {
            *m = (m.affine(c.beta1, 0.0)? + g.affine(1.0 - c.beta1, 0.0)?)?;
            *v = (v.affine(c.beta2, 0.0)? + g.sqr()?.affine(1.0 - c.beta2, 0.0)?)?;
            let denom = v.affine(1.0 / bc2, 0.0)?.sqrt()?.affine(1.0, c.eps)?;
            let update = (m.affine(c.lr / bc1, 0.0)? / denom)?;
            let next = (p.affine(1.0 - c.lr * c.weight_decay, 0.0)? - update)?;
            p.set(&next)?;
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    stoke_ops::numerics::init_compute_threads();
    let threads = rayon::current_num_threads();
    let adamw = AdamWConfig::default();

    let p = params()?;
    let total: usize = p.iter().map(|(_, v)| v.elem_count()).sum();
    let g = grads(&p)?;

    let mut fused = Optimizer::new(OptimizerConfig::AdamW(adamw.clone()), p.clone())?;
    let fused_ms = median_ms(|| fused.step(&g, 1.0).expect("adamw step"));

    let mut tensor_ops = TensorOpAdamW {
        moments: p
            .iter()
            .map(|(_, v)| (v.zeros_like().unwrap(), v.zeros_like().unwrap()))
            .collect(),
        step: 0,
    };
    let tensor_ops_ms = median_ms(|| tensor_ops.step(&p, &g, &adamw).expect("tensor-op step"));

    let mut muon = Optimizer::new(OptimizerConfig::Muon(MuonConfig::default()), p.clone())?;
    let muon_ms = median_ms(|| muon.step(&g, 1.0).expect("muon step"));

    let clip_ms = median_ms(|| {
        let mut grads = g.clone();
        clip_grad_norm(&mut grads, 1e-6).expect("clip");
    });

    // Reference point for Muon: plain f32 matmul throughput at Newton-Schulz's sizes, and the
    // Newton-Schulz flop count of this model (per iteration on an m x n matrix, m <= n:
    // 2 m^2 n for X X^T, 2 m^3 for A A, 2 m^2 n for B X).
    let a = Tensor::randn(0f32, 1.0, (256, 688), &Device::Cpu)?;
    let at = a.t()?;
    let matmul_ms = median_ms(|| {
        a.matmul(&at).expect("matmul");
    });
    let matmul_gflops = 2.0 * 256.0 * 256.0 * 688.0 / (matmul_ms * 1e6);
    let ns_flops: f64 = p
        .iter()
        .filter(|(n, v)| v.rank() == 2 && !n.contains("embed") && !n.contains("lm_head"))
        .map(|(_, v)| {
            let (r, c) = v.dims2().expect("2-D");
            let (m, n) = (r.min(c) as f64, r.max(c) as f64);
            5.0 * (4.0 * m * m * n + 2.0 * m * m * m)
        })
        .sum();
    let muon_gflops = ns_flops / (muon_ms * 1e6);
    println!(
        "{{\"matmul_256x688x256_gflops\": {matmul_gflops:.1}, \"newton_schulz_gflop_per_step\": {:.2}, \"muon_achieved_gflops\": {muon_gflops:.1}}}",
        ns_flops / 1e9
    );
    println!(
        "{{\"params\": {total}, \"rayon_threads\": {threads}, \"adamw_fused_ms\": {fused_ms:.2}, \
         \"adamw_tensor_ops_ms\": {tensor_ops_ms:.2}, \"muon_ms\": {muon_ms:.2}, \"clip_ms\": {clip_ms:.2}}}"
    );
    Ok(())
}
