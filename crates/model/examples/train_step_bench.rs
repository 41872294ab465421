//! Times forward + backward of the next-token loss on a randomly initialised Llama-style
//! model, for comparison with PyTorch eager on the same machine:
//!
//!     cargo run --release -p stoke-model --example train_step_bench -- [hidden layers seq batch steps]
//!
//! Prints the median wall time per step of forward, backward and both, and the process CPU
//! time per step (from /proc/self/stat on Linux; steadier than wall time on a shared machine).

use candle_core::{Device, Tensor};
use std::time::Instant;
use stoke_model::{ModelConfig, Transformer, causal_bias};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    stoke_ops::numerics::init_compute_threads();
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (hidden, layers, seq, batch, steps) =
        (arg(0, 256), arg(1, 4), arg(2, 256), arg(3, 4), arg(4, 5));
    let heads = hidden / 64;
    let json = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 8192, "hidden_size": hidden,
        "intermediate_size": hidden * 8 / 3, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": (heads / 2).max(1),
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false
    });
    let config = ModelConfig::from_json_str(&json.to_string(), std::path::Path::new("<bench>"))?;
    println!("parameters: {}", config.num_parameters());
    let model = Transformer::init(config, &Device::Cpu, 0)?;
    let ids: Vec<u32> = (0..batch * seq)
        .map(|i| ((i * 7919) % 8192) as u32)
        .collect();
    let ids = Tensor::from_vec(ids, (batch, seq), &Device::Cpu)?;
    let positions: Vec<u32> = (0..batch).flat_map(|_| 0..seq as u32).collect();
    let positions = Tensor::from_vec(positions, (batch, seq), &Device::Cpu)?;
    let bias = causal_bias(&vec![vec![true; seq]; batch], seq, &Device::Cpu)?;
    let targets = ids.narrow(1, 1, seq - 1)?.flatten_all()?;
    let mask = Tensor::ones(batch * (seq - 1), candle_core::DType::F32, &Device::Cpu)?;
    let (mut forward_ms, mut backward_ms) = (Vec::new(), Vec::new());
    let mut cpu_start = 0.0;
    for step in 0..steps + 1 {
        if step == 1 {
            cpu_start = process_cpu_ms();
        }
        let start = Instant::now();
        let logits = model.forward(&ids, &positions, &bias, None)?;
        let vocab = logits.dim(2)?;
        let inputs = logits
            .narrow(1, 0, seq - 1)?
            .reshape((batch * (seq - 1), vocab))?;
        let loss = stoke_ops::cross_entropy(&inputs, &targets, &mask)?;
        let _ = loss.to_scalar::<f32>()?;
        let mid = Instant::now();
        let grads = loss.backward()?;
        drop(grads);
        forward_ms.push((mid - start).as_secs_f64() * 1e3);
        backward_ms.push(mid.elapsed().as_secs_f64() * 1e3);
    }
    let median = |v: &mut Vec<f64>| {
        v.remove(0); // warm-up
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let cpu_per_step = (process_cpu_ms() - cpu_start) / steps as f64;
    let (f, b) = (median(&mut forward_ms), median(&mut backward_ms));
    println!(
        "hidden {hidden} layers {layers} seq {seq} batch {batch}: forward {f:.1} ms, backward {b:.1} ms, step {:.1} ms; process CPU {cpu_per_step:.0} ms/step",
        f + b
    );
    Ok(())
}

/// User + system CPU time of this process in ms (0 where /proc is unavailable).
fn process_cpu_ms() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) * 10.0 // USER_HZ is 100 on Linux
}
