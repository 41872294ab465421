//! Attention forward + backward time: `fused_attention` (only the keys the mask allows) against
//! the dense composition (`attention_composed`: full `Q K^T`, masked softmax, `P V`), f32, on
//! SmolLM2-135M's heads (9 query heads, 3 key/value heads, head size 64) under three masks:
//! causal (pretraining, batch 8 x 256), packed documents of 16-128 tokens (SFT) and GRPO's
//! shared prefix (4 sequences of a 47-token prompt and 8 completions of 47 tokens). Prints one
//! line per mask: the allowed fraction of pairs and milliseconds per forward + backward. Not a
//! test.
//!
//! ```text
//! cargo run --release -p stoke-ops --example bench_attention
//! ```
use std::time::Instant;

use candle_core::{Device, Result, Tensor, Var};
use stoke_ops::attention::attention_composed;
use stoke_ops::fused_attention::fused_attention;

/// `[batch, 1, len, len]` additive bias from an `allowed(b, i, j)` rule.
fn bias(batch: usize, len: usize, allowed: impl Fn(usize, usize, usize) -> bool) -> Result<Tensor> {
    let data: Vec<f32> = (0..batch * len * len)
        .map(|idx| {
            let (b, i, j) = (idx / (len * len), (idx / len) % len, idx % len);
            if allowed(b, i, j) {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    Tensor::from_vec(data, (batch, 1, len, len), &Device::Cpu)
}

fn time(
    f: &dyn Fn(&Tensor, &Tensor, &Tensor, &Tensor) -> Result<Tensor>,
    vars: &[Var; 3],
    bias: &Tensor,
) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..4 {
        let start = Instant::now();
        let out = f(
            vars[0].as_tensor(),
            vars[1].as_tensor(),
            vars[2].as_tensor(),
            bias,
        )?;
        let grads = out.sqr()?.sum_all()?.backward()?;
        assert!(grads.get(vars[1].as_tensor()).is_some());
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best * 1e3)
}

fn main() -> Result<()> {
    let dev = Device::Cpu;
    let (hq, hkv, d) = (9, 3, 64);
    // Packed documents: lengths 16..128 from a fixed pattern; a key is allowed within the
    // query's own document, causally.
    let doc_of = |i: usize| {
        let (mut start, mut doc) = (0, 0);
        loop {
            let len = 16 + (doc * 37) % 113;
            if i < start + len {
                return doc;
            }
            start += len;
            doc += 1;
        }
    };
    let (prompt, completion, samples) = (47, 47, 8);
    let segment = |i: usize| {
        if i < prompt {
            0
        } else {
            1 + (i - prompt) / completion
        }
    };
    let cases: Vec<(&str, usize, usize, Tensor)> = vec![
        ("causal 8 x 256", 8, 256, bias(8, 256, |_, i, j| j <= i)?),
        (
            "packed documents 8 x 256",
            8,
            256,
            bias(8, 256, |_, i, j| j <= i && doc_of(i) == doc_of(j))?,
        ),
        (
            "shared prefix 4 x 423",
            4,
            prompt + samples * completion,
            bias(4, prompt + samples * completion, |_, i, j| {
                j <= i && (segment(j) == 0 || segment(j) == segment(i))
            })?,
        ),
    ];
    for (name, batch, len, mask) in cases {
        let vars = [
            Var::randn(0f32, 1.0, (batch, hq, len, d), &dev)?,
            Var::randn(0f32, 1.0, (batch, hkv, len, d), &dev)?,
            Var::randn(0f32, 1.0, (batch, hkv, len, d), &dev)?,
        ];
        let allowed: f32 = mask
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .filter(|v| v.is_finite())
            .count() as f32
            / (batch * len * len) as f32;
        let fused = time(&fused_attention, &vars, &mask)?;
        let dense = time(&attention_composed, &vars, &mask)?;
        println!(
            "{name}: {:.0}% of pairs allowed; fused {fused:.1} ms, dense {dense:.1} ms ({:.2}x)",
            allowed * 100.0,
            dense / fused
        );
    }
    Ok(())
}
