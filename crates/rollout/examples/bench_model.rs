//! Model benchmark: the Rust side of bench/torch_reference.py (same model, same shapes, same
//! protocol), printing one JSON object. Not a test: timings depend on the machine and its load.
//!
//! Measures, for the model of bench/bench_config.json with random weights (seed 0):
//! (a) training-step throughput: forward + next-token cross-entropy + backward (no optimizer),
//!     batch 8 x seq 256, 2 warmup steps then 5 timed steps;
//! (b) greedy decoding with the KV cache, batch 8 and batch 1: a 32-token prompt then 128 new
//!     tokens, with prefill and decode timed separately (a bare model + cache loop, as the
//!     reference does: the fused decode step where the model supports it, else `forward` with
//!     the graph cache; `STOKE_DECODE=graph` forces the latter) and end to end through
//!     `Engine::generate` (sampling and bookkeeping included).
//!
//! Run: `cargo run --release -p stoke-rollout --example bench_model [-- CONFIG.json]`
//! Threads: candle uses rayon's global pool; set RAYON_NUM_THREADS=2 to match the reference's
//! `torch.set_num_threads(2)`.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, IndexOp, Tensor};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde_json::{Value, json};
use stoke_model::{KvCache, ModelConfig, Transformer, causal_bias};
use stoke_rollout::engine::Engine;
use stoke_rollout::{GenerationRequest, SamplingParams};

const TRAIN_BATCH: usize = 8;
const TRAIN_SEQ: usize = 256;
const WARMUP_STEPS: usize = 2;
const TIMED_STEPS: usize = 5;
const PROMPT_LEN: usize = 32;
const NEW_TOKENS: usize = 128;
/// Decode batch sizes measured unless `--batches` says otherwise.
const DECODE_BATCHES: [usize; 2] = [8, 1];

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> BenchResult<()> {
    // [--precision f32|bf16] [--decode-only] [--batches 1,8] [--weights DIR] [CONFIG.json]; bf16
    // packs the weights once
    // (`Transformer::pack_weights`), as generation does.
    let mut config_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../bench/bench_config.json");
    let mut precision = stoke_ops::Precision::F32;
    let mut decode_only = false;
    // The engine's sampling temperature (0 = greedy, as the bare loop).
    let mut temperature = 0.0f32;
    // A checkpoint folder (config.json + safetensors) instead of random weights of CONFIG.
    let mut weights: Option<PathBuf> = None;
    let mut batches = DECODE_BATCHES.to_vec();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--precision" => {
                precision = args
                    .next()
                    .ok_or("--precision needs f32 or bf16")?
                    .parse()
                    .map_err(|e: String| format!("--precision: {e}"))?;
            }
            "--decode-only" => decode_only = true,
            "--batches" => {
                batches = args
                    .next()
                    .ok_or("--batches needs a list such as 1,8")?
                    .split(',')
                    .map(|b| b.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--batches: {e}"))?;
            }
            "--temperature" => {
                temperature = args.next().ok_or("--temperature needs a number")?.parse()?;
            }
            "--weights" => {
                weights = Some(PathBuf::from(
                    args.next().ok_or("--weights needs a model folder")?,
                ))
            }
            _ => config_path = PathBuf::from(arg),
        }
    }
    stoke_ops::numerics::init_compute_threads();
    let device = Device::Cpu;
    let mut model = match &weights {
        Some(dir) => {
            config_path = dir.join("config.json");
            Transformer::load(dir, &device)?
        }
        None => Transformer::init(ModelConfig::from_file(&config_path)?, &device, 0)?,
    };
    let parameters = model.config().num_parameters();
    let vocab = model.config().vocab_size;
    let load_at_start = load_average();
    let train = if decode_only {
        Value::Null
    } else {
        bench_train(&model, vocab, &device)?
    };
    if precision == stoke_ops::Precision::Bf16 {
        model.pack_weights()?;
    }
    let mut decode = Vec::new();
    for batch in batches {
        decode.push(bench_decode(&model, vocab, batch, temperature, &device)?);
    }
    let result = json!({
        "implementation": format!("stoke (candle CPU, {precision})"),
        "bf16_kernel": stoke_ops::bf16::backend().name(),
        "kernels": kernels(),
        "packed_weight_bytes": model.packed_weight_bytes(),
        "config": config_path.display().to_string(),
        "weights": weights.as_ref().map_or("random (seed 0)".to_string(), |w| w.display().to_string()),
        "parameters": parameters,
        "threads": rayon_threads(),
        "load_average_at_start": load_at_start,
        "train": train,
        "decode": decode,
        "load_average_at_end": load_average(),
    });
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

fn random_ids(rows: usize, cols: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..rows * cols)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

fn train_step(model: &Transformer, ids: &Tensor, device: &Device) -> BenchResult<f32> {
    let (batch, seq) = ids.dims2()?;
    let positions = Tensor::arange(0u32, seq as u32, device)?
        .unsqueeze(0)?
        .repeat((batch, 1))?;
    let bias = causal_bias(&vec![vec![true; seq]; batch], seq, device)?;
    let logits = model.forward(ids, &positions, &bias, None)?;
    let vocab = logits.dim(2)?;
    let predictions = logits
        .narrow(1, 0, seq - 1)?
        .reshape((batch * (seq - 1), vocab))?;
    let targets = ids.narrow(1, 1, seq - 1)?.flatten_all()?;
    let mask = Tensor::ones(batch * (seq - 1), DType::F32, device)?;
    let loss = stoke_ops::cross_entropy(&predictions, &targets, &mask)?;
    let gradients = loss.backward()?;
    // Touch the gradients so nothing can be optimized away, and drop them (no optimizer step).
    std::hint::black_box(&gradients);
    Ok(loss.to_scalar::<f32>()?)
}

fn bench_train(model: &Transformer, vocab: usize, device: &Device) -> BenchResult<Value> {
    let ids = Tensor::from_vec(
        random_ids(TRAIN_BATCH, TRAIN_SEQ, vocab, 1),
        (TRAIN_BATCH, TRAIN_SEQ),
        device,
    )?;
    for _ in 0..WARMUP_STEPS {
        train_step(model, &ids, device)?;
    }
    let cpu_start = process_cpu_seconds();
    let mut times = Vec::new();
    let mut loss = 0.0;
    for _ in 0..TIMED_STEPS {
        let start = Instant::now();
        loss = train_step(model, &ids, device)?;
        times.push(start.elapsed().as_secs_f64());
    }
    let total: f64 = times.iter().sum();
    let cpu = process_cpu_seconds() - cpu_start;
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let tokens = (TRAIN_BATCH * TRAIN_SEQ * TIMED_STEPS) as f64;
    Ok(json!({
        "batch": TRAIN_BATCH,
        "seq": TRAIN_SEQ,
        "warmup_steps": WARMUP_STEPS,
        "timed_steps": TIMED_STEPS,
        "step_seconds": times,
        "tokens_per_second": tokens / total,
        "tokens_per_second_median_step": (TRAIN_BATCH * TRAIN_SEQ) as f64 / median,
        "cpu_per_wall": cpu / total,
        "last_loss": loss,
    }))
}

/// Prefill then NEW_TOKENS - 1 greedy decode steps with the model and cache directly.
fn bare_decode(
    model: &Transformer,
    prompt: &Tensor,
    device: &Device,
) -> BenchResult<(f64, f64, Vec<u32>)> {
    let (batch, prompt_len) = prompt.dims2()?;
    let mut cache = KvCache::new(model.config().num_hidden_layers);
    let start = Instant::now();
    let positions = Tensor::arange(0u32, prompt_len as u32, device)?
        .unsqueeze(0)?
        .repeat((batch, 1))?;
    let mut key_valid = vec![vec![true; prompt_len]; batch];
    let bias = causal_bias(&key_valid, prompt_len, device)?;
    let logits = model.forward(prompt, &positions, &bias, Some(&mut cache))?;
    let mut next = logits
        .i((.., prompt_len - 1, ..))?
        .argmax_keepdim(1)?
        .to_dtype(DType::U32)?;
    let prefill = start.elapsed().as_secs_f64();
    let mut first_row = vec![next.i((0, 0))?.to_scalar::<u32>()?];
    if fused_path(model) {
        // The fused step on a preallocated cache (what `Engine::generate` runs).
        let start = Instant::now();
        let rows: Vec<usize> = (0..batch).collect();
        let mut fused =
            model.decode_cache_from(&cache, &rows, &vec![0; batch], prompt_len + NEW_TOKENS)?;
        let vocab = model.config().vocab_size;
        let mut tokens: Vec<u32> = next.flatten_all()?.to_vec1()?;
        for step in 0..NEW_TOKENS - 1 {
            let positions = vec![(prompt_len + step) as u32; batch];
            let logits = model.decode_step(&mut fused, &tokens, &positions)?;
            tokens = logits.chunks_exact(vocab).map(argmax).collect();
            if first_row.len() < 8 {
                first_row.push(tokens[0]);
            }
        }
        return Ok((prefill, start.elapsed().as_secs_f64(), first_row));
    }
    let start = Instant::now();
    for step in 0..NEW_TOKENS - 1 {
        for valid in &mut key_valid {
            valid.push(true);
        }
        let positions = Tensor::full((prompt_len + step) as u32, (batch, 1), device)?;
        let bias = causal_bias(&key_valid, 1, device)?;
        let logits = model.forward(&next, &positions, &bias, Some(&mut cache))?;
        next = logits
            .i((.., 0, ..))?
            .argmax_keepdim(1)?
            .to_dtype(DType::U32)?;
        if first_row.len() < 8 {
            first_row.push(next.i((0, 0))?.to_scalar::<u32>()?);
        }
    }
    Ok((prefill, start.elapsed().as_secs_f64(), first_row))
}

/// Whether decoding runs the fused step (`STOKE_DECODE=graph` keeps the tensor graph, as in
/// `Engine::generate`).
fn fused_path(model: &Transformer) -> bool {
    model.supports_fused_decode()
        && stoke_ops::dispatch::decode_path() == stoke_ops::dispatch::DecodePath::Fused
}

/// The first index of the largest value (torch.argmax's tie rule).
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn bench_decode(
    model: &Transformer,
    vocab: usize,
    batch: usize,
    temperature: f32,
    device: &Device,
) -> BenchResult<Value> {
    let prompt_ids = random_ids(batch, PROMPT_LEN, vocab, 2);
    let prompt = Tensor::from_vec(prompt_ids.clone(), (batch, PROMPT_LEN), device)?;
    bare_decode(model, &prompt, device)?; // warmup
    let cpu_start = process_cpu_seconds();
    let (prefill, decode, first_row) = bare_decode(model, &prompt, device)?;
    let cpu = process_cpu_seconds() - cpu_start;

    let engine = Engine::new(model);
    let params = SamplingParams {
        max_new_tokens: NEW_TOKENS,
        temperature,
        ..Default::default()
    };
    let prompts: Vec<Vec<u32>> = prompt_ids.chunks(PROMPT_LEN).map(<[u32]>::to_vec).collect();
    let request = GenerationRequest::new(prompts, params);
    engine.generate(&request, None)?; // warmup, as for the bare loop
    let start = Instant::now();
    let output = engine.generate(&request, None)?;
    let engine_seconds = start.elapsed().as_secs_f64();
    let engine_first_row: Vec<u32> = output.completions[0][0]
        .token_ids
        .iter()
        .take(8)
        .copied()
        .collect();

    Ok(json!({
        "batch": batch,
        "decode_path": if fused_path(model) { "fused" } else { "graph" },
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "prefill_seconds": prefill,
        "decode_seconds": decode,
        "decode_tokens_per_second": (batch * (NEW_TOKENS - 1)) as f64 / decode,
        "end_to_end_tokens_per_second": (batch * NEW_TOKENS) as f64 / (prefill + decode),
        "cpu_per_wall": cpu / (prefill + decode),
        "first_row_first_tokens": first_row,
        "engine_seconds": engine_seconds,
        "engine_tokens_per_second": output.generated_tokens as f64 / engine_seconds,
        "engine_temperature": temperature,
        "engine_matches_bare_loop": temperature > 0.0 || engine_first_row == first_row,
    }))
}

fn load_average() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// User + system CPU time of this process, from /proc/self/stat (fields 14 and 15, in clock
/// ticks; 100 per second on Linux).
fn process_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // after the ")" field 3 (state) is index 0, so utime (14) is index 11 and stime (15) index 12.
    (ticks(11) + ticks(12)) / 100.0
}

/// The kernels chosen on this CPU (`stoke_ops::dispatch::chosen`), as a JSON object.
fn kernels() -> Value {
    let chosen = stoke_ops::dispatch::chosen().into_iter();
    Value::Object(
        chosen
            .map(|(key, value)| (key.to_string(), Value::String(value)))
            .collect(),
    )
}
