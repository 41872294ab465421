//! Batch-1 decoding as a share of the memory-read ceiling, both measured in one process, in
//! alternation: the issue's target is "batch 1 at least 80% of the memory-bandwidth ceiling for
//! the weight precision used".
//!
//! Why in one process: on a shared VM the read rate moves between about 25 and 60 GB/s within
//! minutes, so a decode run and a ceiling measured a minute apart can be off by a factor of two
//! either way. Here each round decodes `STEPS` greedy tokens from a fresh cache (bf16 weights in
//! the layout generation uses, `Transformer::pack_weights`), then measures the ceiling
//! (`stoke_ops::bandwidth::ceiling`: the best of plain read loops over 256 MiB of distinct words,
//! 1 or 8 streams a thread, prefetch 0 or 256 bytes, on 4 KiB pages and on 2 MiB huge pages, on
//! the same number of threads). A round's share is the decode's weight bytes per second (every
//! packed weight byte is read once a token: `packed_weight_bytes`) over that round's ceiling.
//! Prints every round and the medians as JSON. Not a test: timings depend on the machine.
//!
//! ```text
//! cargo build --release -p stoke-rollout --example bench_decode_share
//! RAYON_NUM_THREADS=2 target/release/examples/bench_decode_share --weights $SCRATCH/smollm2/hf [--rounds 10] [--steps 48]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use candle_core::Device;
use serde_json::json;
use stoke_model::{ModelConfig, Transformer};
use stoke_ops::bandwidth::{ReadBuffer, ceiling};

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut weights: Option<PathBuf> = None;
    let mut config = PathBuf::from("bench/smollm2_135m_config.json");
    let (mut rounds, mut steps) = (10usize, 48usize);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--weights" => weights = Some(PathBuf::from(value()?)),
            "--config" => config = PathBuf::from(value()?),
            "--rounds" => rounds = value()?.parse::<usize>()?.max(1),
            "--steps" => steps = value()?.parse::<usize>()?.max(1),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    let device = Device::Cpu;
    let mut model = match &weights {
        Some(dir) => Transformer::load(dir, &device)?,
        None => Transformer::init(ModelConfig::from_file(&config)?, &device, 0)?,
    };
    model.pack_weights()?;
    if !model.supports_fused_decode() {
        return Err(
            "this model has no fused decode step (see Transformer::supports_fused_decode)".into(),
        );
    }
    let bytes_per_token = model.packed_weight_bytes() as f64;
    let vocab = model.config().vocab_size;
    let threads = rayon::current_num_threads();
    let buffers = [ReadBuffer::new(256, false), ReadBuffer::new(256, true)];
    let buffers: Vec<&ReadBuffer> = buffers.iter().collect();
    let decode = |model: &Transformer| -> Result<f64, Box<dyn std::error::Error>> {
        let mut cache = model.new_decode_cache(1, steps + 1);
        let mut token = 1u32;
        let start = Instant::now();
        for step in 0..steps {
            let logits = model.decode_step(&mut cache, &[token], &[step as u32])?;
            token = (0..vocab).fold(0, |best, i| if logits[i] > logits[best] { i } else { best })
                as u32;
        }
        Ok(steps as f64 / start.elapsed().as_secs_f64())
    };
    decode(&model)?; // warmup
    let mut per_round = Vec::new();
    let (mut tokens, mut ceilings, mut shares) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let tok_s = decode(&model)?;
        let ceiling_gb = ceiling(&buffers, threads);
        let decode_gb = tok_s * bytes_per_token / 1e9;
        let share = decode_gb / ceiling_gb;
        per_round.push(json!({
            "round": round,
            "decode_tokens_per_s": (tok_s * 10.0).round() / 10.0,
            "decode_gb_per_s": (decode_gb * 10.0).round() / 10.0,
            "ceiling_gb_per_s": (ceiling_gb * 10.0).round() / 10.0,
            "share": (share * 1000.0).round() / 1000.0,
        }));
        tokens.push(tok_s);
        ceilings.push(ceiling_gb);
        shares.push(share);
    }
    let out = json!({
        "weights": weights.as_ref().map_or(format!("random ({})", config.display()), |w| w.display().to_string()),
        "threads": threads,
        "batch": 1,
        "steps_per_round": steps,
        "bytes_per_token": bytes_per_token,
        "huge_pages_in_ceiling": buffers[1].is_huge(),
        "rounds": per_round,
        "median_decode_tokens_per_s": median(&tokens),
        "median_ceiling_gb_per_s": median(&ceilings),
        "median_ceiling_tokens_per_s": median(&ceilings) * 1e9 / bytes_per_token,
        "median_share": median(&shares),
        "cpu": cpu_model(),
        "kernels": stoke_ops::dispatch::chosen()
            .into_iter()
            .map(|(key, value)| (key.to_string(), serde_json::Value::String(value)))
            .collect::<serde_json::Map<_, _>>(),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// `model name` from /proc/cpuinfo, so each figure names its CPU.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}
