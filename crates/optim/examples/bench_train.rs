//! Training-step benchmark: the Rust side of workloads (c) "pretrain" and (d) "sft_packed" of
//! bench/torch_reference.py (same model, same batch bit for bit, same protocol), printing one
//! JSON object. Not a test: timings depend on the machine and its load.
//!
//! For the model of bench/bench_config.json with random weights (seed 0) and
//! `Optimizer` = AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.1; stoke's groups: no
//! decay on the embedding and norms, as the reference's param groups), batch 8 x seq 256:
//! - pretrain: forward (causal mask, positions 0..T) + next-token loss over all 8 x 255
//!   predictions + backward + optimizer step;
//! - sft_packed: rows packed with documents of 16..128 tokens (splitmix64, the last one cut to
//!   fit), positions restarting at 0 per document, `document_causal_bias`, loss = masked sum of
//!   `token_logprobs` / count over the second half of every document, backward, optimizer step.
//!
//! The loss head is `--loss summed` (default, as stoke-train's next-token objective; in bf16:
//! `stoke_ops::linear_target_logprob_sum` on the hidden states of the loss positions, which
//! forms the head's gradients in its forward pass; in f32 the same as `fused`), `--loss fused`
//! (`stoke_ops::linear_target_logprobs`, the LM head and the target log-probabilities as one
//! graph node, on the hidden states of the first T - 1 positions, then a masked sum) or
//! `--loss composed` (`Transformer::forward` logits, narrowed to T - 1 positions, then
//! `stoke_ops::token_logprobs`), to measure the fused ops against the composition.
//!
//! 2 warmup + 5 timed steps each; tokens/s = 8 x 256 x 5 / time (every token, masked or not).
//! Also reports each step's pieces (forward, loss, backward, optimizer; median ms) to show where
//! the time goes.
//!
//! Run (threads: RAYON_NUM_THREADS=2 matches the reference's `torch.set_num_threads(2)`):
//!
//! ```text
//! CARGO_TARGET_DIR=target-bench cargo build --release -p stoke-optim --example bench_train
//! RAYON_NUM_THREADS=2 $STOKE_TARGET/release/examples/bench_train [--only pretrain,sft_packed]
//!     [--loss summed|fused|composed] [--precision f32|bf16] [--activation-checkpointing]
//!     [--moments f32|int8] [--lora RANK] [--batch B] [--seq T] [--warmup N] [--steps N] [CONFIG.json]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use serde_json::{Value, json};
use stoke_model::{ModelConfig, Transformer, causal_bias, document_causal_bias};
use stoke_optim::{AdamWConfig, Optimizer, OptimizerConfig};

/// The step's shape and length (defaults: batch 8 x 256, 2 warmup + 5 timed steps; `--batch`,
/// `--seq`, `--warmup`, `--steps` change them, e.g. for a 1B-class memory run).
#[derive(Clone, Copy)]
struct RunShape {
    batch: usize,
    seq: usize,
    warmup: usize,
    timed: usize,
}
const SEED: u64 = 0;
const LR: f64 = 1e-3;
const WEIGHT_DECAY: f64 = 0.1;
/// splitmix64 seed of the token ids and the document layout (as in torch_reference.py).
const BATCH_SEED: u64 = 0x5EED_0005;
const DOC_LEN_MIN: u64 = 16;
/// Inclusive.
const DOC_LEN_MAX: u64 = 128;
const WORKLOADS: [&str; 2] = ["pretrain", "sft_packed"];

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> BenchResult<()> {
    let mut only: Vec<String> = WORKLOADS.iter().map(|w| w.to_string()).collect();
    let mut config_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../bench/bench_config.json");
    let mut loss_head = LossHead::Summed;
    let mut precision = stoke_ops::Precision::F32;
    let mut checkpointing = false;
    let mut lora_rank: Option<usize> = None;
    let mut moments = stoke_optim::MomentFormat::F32;
    let mut shape = RunShape {
        batch: 8,
        seq: 256,
        warmup: 2,
        timed: 5,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--loss" {
            loss_head = match args.next().as_deref() {
                Some("summed") => LossHead::Summed,
                Some("fused") => LossHead::Fused,
                Some("composed") => LossHead::Composed,
                other => {
                    return Err(format!(
                        "--loss: expected summed, fused or composed, got {other:?}"
                    )
                    .into());
                }
            };
        } else if arg == "--precision" {
            precision = args
                .next()
                .ok_or("--precision needs f32 or bf16")?
                .parse()
                .map_err(|e: String| format!("--precision: {e}"))?;
        } else if let Some(slot) = match arg.as_str() {
            "--batch" => Some(&mut shape.batch),
            "--seq" => Some(&mut shape.seq),
            "--warmup" => Some(&mut shape.warmup),
            "--steps" => Some(&mut shape.timed),
            _ => None,
        } {
            *slot = args
                .next()
                .and_then(|v| v.parse().ok())
                .filter(|&v: &usize| v > 0 || arg == "--warmup")
                .ok_or_else(|| format!("{arg} needs a positive integer"))?;
        } else if arg == "--moments" {
            moments = match args.next().as_deref() {
                Some("f32") => stoke_optim::MomentFormat::F32,
                Some("int8") => stoke_optim::MomentFormat::Int8,
                other => {
                    return Err(format!("--moments: expected f32 or int8, got {other:?}").into());
                }
            };
        } else if arg == "--lora" {
            lora_rank = Some(
                args.next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&r: &usize| r > 0)
                    .ok_or("--lora needs a positive rank")?,
            );
        } else if arg == "--activation-checkpointing" {
            checkpointing = true;
        } else if arg == "--only" {
            let list = args.next().ok_or("--only needs a comma-separated list")?;
            only = list
                .split(',')
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect();
            if let Some(bad) = only.iter().find(|w| !WORKLOADS.contains(&w.as_str())) {
                return Err(
                    format!("--only: unknown workload {bad}; choose from {WORKLOADS:?}").into(),
                );
            }
        } else {
            config_path = PathBuf::from(arg);
        }
    }
    stoke_ops::numerics::init_compute_threads();
    let config = ModelConfig::from_file(&config_path)?;
    let mut result = json!({
        "implementation": format!("stoke (candle CPU, {precision})"),
        "precision": precision.as_str(),
        "bf16_kernel": stoke_ops::bf16::backend().name(),
        "kernels": kernels(),
        "config": config_path.display().to_string(),
        "parameters": config.num_parameters(),
        "threads": env_threads("RAYON_NUM_THREADS"),
        "candle_num_threads": std::env::var("CANDLE_NUM_THREADS").ok(),
        "loss_head": format!("{loss_head:?}").to_lowercase(),
        "activation_checkpointing": checkpointing,
        "lora_rank": lora_rank,
        "moments": format!("{moments:?}").to_lowercase(),
        "load_average_at_start": load_average(),
    });
    for workload in &only {
        result[workload.as_str()] = bench_full_step(
            &config,
            workload,
            loss_head,
            precision,
            (checkpointing, lora_rank),
            shape,
            moments,
        )?;
    }
    result["load_average_at_end"] = json!(load_average());
    result["peak_rss_bytes"] = json!(peak_rss_bytes());
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

/// How the step computes the per-token log-probabilities from the model.
#[derive(Clone, Copy, Debug)]
enum LossHead {
    /// `forward_hidden`, the loss positions' rows, `linear_target_logprob_sum` with the LM head.
    Summed,
    /// `forward_hidden`, narrow to T - 1 positions, `linear_target_logprobs` with the LM head.
    Fused,
    /// `forward` (logits), narrow to T - 1 positions, `token_logprobs`.
    Composed,
}

/// What the loss is taken from: per-position log-probabilities, or their sum over the loss
/// positions.
enum LossInput {
    Rows(Tensor),
    Sum(Tensor),
}

/// splitmix64 (Steele, Lea, Flood 2014); identical to `SplitMix64` in torch_reference.py.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The shared batch (see `training_batch` in torch_reference.py for the exact recipe).
struct TrainingBatch {
    ids: Vec<u32>,
    positions: Vec<u32>,
    doc_ids: Vec<Vec<u32>>,
    /// Per position t: whether token t + 1 is a loss target (same document, not a prompt token).
    loss_mask: Vec<f32>,
    documents: usize,
}

fn training_batch(vocab: u64, batch: usize, seq: usize) -> TrainingBatch {
    let mut rng = SplitMix64(BATCH_SEED);
    let (mut positions, mut doc_ids, mut loss_mask) = (Vec::new(), Vec::new(), Vec::new());
    let mut documents = 0;
    for _ in 0..batch {
        let (mut row_docs, mut row_pos, mut row_prompt) = (Vec::new(), Vec::new(), Vec::new());
        let mut doc = 0u32;
        while row_docs.len() < seq {
            let drawn = DOC_LEN_MIN + rng.next() % (DOC_LEN_MAX - DOC_LEN_MIN + 1);
            let length = (drawn as usize).min(seq - row_docs.len());
            row_docs.extend(std::iter::repeat_n(doc, length));
            row_pos.extend(0..length as u32);
            row_prompt.extend(std::iter::repeat_n((length / 2) as u32, length));
            doc += 1;
        }
        documents += doc as usize;
        for t in 0..seq {
            let target = t + 1 < seq
                && row_docs[t + 1] == row_docs[t]
                && row_pos[t + 1] >= row_prompt[t + 1];
            loss_mask.push(if target { 1.0 } else { 0.0 });
        }
        positions.extend(row_pos);
        doc_ids.push(row_docs);
    }
    let ids = (0..batch * seq)
        .map(|_| (rng.next() % vocab) as u32)
        .collect();
    TrainingBatch {
        ids,
        positions,
        doc_ids,
        loss_mask,
        documents,
    }
}

/// The tensors one workload's step consumes, built once (as the reference builds its mask once).
struct StepInputs {
    ids: Tensor,
    positions: Tensor,
    bias: Tensor,
    /// [B * (T - 1)] next-token targets and their 0/1 loss mask.
    targets: Tensor,
    mask: Tensor,
    loss_tokens: usize,
    documents: usize,
    id_sum: u64,
}

fn step_inputs(
    batch: &TrainingBatch,
    workload: &str,
    (b, t): (usize, usize),
    device: &Device,
) -> BenchResult<StepInputs> {
    let ids = Tensor::from_vec(batch.ids.clone(), (b, t), device)?;
    let targets = ids.narrow(1, 1, t - 1)?.flatten_all()?;
    let id_sum = batch.ids.iter().map(|&i| u64::from(i)).sum();
    if workload == "pretrain" {
        let positions = Tensor::arange(0u32, t as u32, device)?
            .unsqueeze(0)?
            .repeat((b, 1))?;
        let bias = causal_bias(&vec![vec![true; t]; b], t, device)?;
        let mask = Tensor::ones(b * (t - 1), DType::F32, device)?;
        return Ok(StepInputs {
            ids,
            positions,
            bias,
            targets,
            mask,
            loss_tokens: b * (t - 1),
            documents: b,
            id_sum,
        });
    }
    let positions = Tensor::from_vec(batch.positions.clone(), (b, t), device)?;
    let bias = document_causal_bias(&batch.doc_ids, device)?;
    // Position t's mask entry covers target t + 1; drop each row's last position (no target).
    let mask = Tensor::from_vec(batch.loss_mask.clone(), (b, t), device)?
        .narrow(1, 0, t - 1)?
        .flatten_all()?;
    let loss_tokens = batch.loss_mask.iter().filter(|&&m| m > 0.0).count();
    Ok(StepInputs {
        ids,
        positions,
        bias,
        targets,
        mask,
        loss_tokens,
        documents: batch.documents,
        id_sum,
    })
}

/// Seconds spent in each piece of one step.
#[derive(Clone, Copy, Default)]
struct Pieces {
    forward: f64,
    loss: f64,
    backward: f64,
    optimizer: f64,
}

/// Forward, loss = -(sum of masked target log-probs) / count, backward, optimizer step.
/// The autograd graph behind a loss: candle's backward gives every non-variable node a
/// gradient accumulated as `zeros_like` + `add`, so the summed element count of those nodes
/// measures that overhead (the fused ops exist to shrink it).
#[derive(Clone, Default)]
struct GraphSize {
    nodes: usize,
    elements: usize,
    /// Node count per shape, the most elements first.
    by_shape: Vec<(Vec<usize>, usize)>,
}

fn graph_size(loss: &Tensor) -> GraphSize {
    let nodes: Vec<&Tensor> = loss
        .sorted_nodes()
        .into_iter()
        .filter(|t| !t.is_variable())
        .collect();
    let mut by_shape = std::collections::BTreeMap::<Vec<usize>, usize>::new();
    for node in &nodes {
        *by_shape.entry(node.dims().to_vec()).or_default() += 1;
    }
    let mut by_shape: Vec<(Vec<usize>, usize)> = by_shape.into_iter().collect();
    by_shape
        .sort_by_key(|(shape, count)| std::cmp::Reverse(shape.iter().product::<usize>() * count));
    GraphSize {
        nodes: nodes.len(),
        elements: nodes.iter().map(|t| t.elem_count()).sum(),
        by_shape,
    }
}

/// With `LossHead::Fused` or `Summed` the "forward" piece ends at the final hidden states and
/// the LM head is timed inside "loss".
fn full_step(
    model: &Transformer,
    optimizer: &mut Optimizer,
    inputs: &StepInputs,
    loss_head: LossHead,
    lm_head: &Tensor,
    graph: Option<&mut GraphSize>,
) -> BenchResult<(f32, Pieces)> {
    let mut pieces = Pieces::default();
    let start = Instant::now();
    let (ids, positions, bias) = (&inputs.ids, &inputs.positions, &inputs.bias);
    let (logprobs, forward_done) = match loss_head {
        // The summed head is the trainer's route in bf16 only; f32 keeps the per-row head (and
        // its chunked form under checkpointing), as stoke-train does.
        LossHead::Summed if model.precision() == stoke_ops::Precision::Bf16 => {
            let hidden = model.forward_hidden(ids, positions, bias, None)?;
            let (b, t, width) = hidden.dims3()?;
            let hidden = hidden.narrow(1, 0, t - 1)?.reshape((b * (t - 1), width))?;
            let forward_done = Instant::now();
            // The loss positions' rows only, as stoke-train scores them.
            let rows: Vec<u32> = inputs
                .mask
                .to_vec1::<f32>()?
                .iter()
                .enumerate()
                .filter(|(_, m)| **m > 0.0)
                .map(|(i, _)| i as u32)
                .collect();
            let index = Tensor::from_vec(rows, inputs.loss_tokens, hidden.device())?;
            let (sum, _) = stoke_ops::linear_target_logprob_sum(
                &hidden.index_select(&index, 0)?,
                lm_head,
                &inputs.targets.index_select(&index, 0)?,
                model.precision(),
            )?;
            (LossInput::Sum(sum), forward_done)
        }
        LossHead::Composed => {
            let logits = model.forward(ids, positions, bias, None)?;
            let (b, t, vocab) = logits.dims3()?;
            let predictions = logits.narrow(1, 0, t - 1)?.reshape((b * (t - 1), vocab))?;
            let forward_done = Instant::now();
            (
                LossInput::Rows(stoke_ops::token_logprobs(&predictions, &inputs.targets)?),
                forward_done,
            )
        }
        LossHead::Fused | LossHead::Summed => {
            let hidden = model.forward_hidden(ids, positions, bias, None)?;
            let (b, t, width) = hidden.dims3()?;
            let hidden = hidden.narrow(1, 0, t - 1)?.reshape((b * (t - 1), width))?;
            let forward_done = Instant::now();
            // With checkpointing the head runs in chunks too (as stoke-train's objectives do).
            let head = if model.activation_checkpointing() {
                stoke_ops::linear_target_logprobs_chunked
            } else {
                stoke_ops::linear_target_logprobs_with
            };
            let logprobs = head(&hidden, lm_head, &inputs.targets, model.precision())?;
            (LossInput::Rows(logprobs), forward_done)
        }
    };
    pieces.forward = (forward_done - start).as_secs_f64();
    let loss = match logprobs {
        LossInput::Sum(sum) => (sum.neg()? / inputs.loss_tokens as f64)?,
        LossInput::Rows(logprobs) => {
            ((logprobs * &inputs.mask)?.sum_all()?.neg()? / inputs.loss_tokens as f64)?
        }
    };
    let loss_value = loss.to_scalar::<f32>()?;
    let loss_done = Instant::now();
    pieces.loss = (loss_done - forward_done).as_secs_f64();
    if let Some(graph) = graph {
        *graph = graph_size(&loss);
    }
    let grads = loss.backward()?;
    let backward_done = Instant::now();
    pieces.backward = (backward_done - loss_done).as_secs_f64();
    let grads: Vec<Tensor> = optimizer
        .params()
        .iter()
        .map(|(name, var)| {
            grads
                .get(var.as_tensor())
                .cloned()
                .ok_or_else(|| format!("no gradient for {name}"))
        })
        .collect::<Result<_, _>>()?;
    optimizer.step(&grads, 1.0)?;
    pieces.optimizer = backward_done.elapsed().as_secs_f64();
    Ok((loss_value, pieces))
}

fn bench_full_step(
    config: &ModelConfig,
    workload: &str,
    loss_head: LossHead,
    precision: stoke_ops::Precision,
    (checkpointing, lora_rank): (bool, Option<usize>),
    shape: RunShape,
    moments: stoke_optim::MomentFormat,
) -> BenchResult<Value> {
    let device = Device::Cpu;
    let mut model = Transformer::init(config.clone(), &device, SEED)?.with_precision(precision);
    model.set_activation_checkpointing(checkpointing);
    if let Some(r) = lora_rank {
        // LoRA on every linear layer of the blocks, alpha = 2r; the base is frozen.
        let lora = stoke_model::lora::LoraConfig {
            r,
            lora_alpha: 2.0 * r as f64,
            lora_dropout: 0.0,
            target_modules: vec!["all-linear".into()],
            use_rslora: false,
        };
        model.add_lora(&lora, SEED)?;
    }
    // The LM head's weight [V, H] (the embedding when tied), by its HF name.
    let head_name = if config.tie_word_embeddings {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    };
    let lm_head = model.lm_head_weight().clone();
    if !model.parameters().iter().any(|(name, _)| name == head_name) {
        return Err(format!("the model has no parameter {head_name}").into());
    }
    let adamw = AdamWConfig {
        lr: LR,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: WEIGHT_DECAY,
        moments,
    };
    let mut optimizer =
        Optimizer::new(OptimizerConfig::AdamW(adamw), model.trainable_parameters())?;
    let batch = training_batch(config.vocab_size as u64, shape.batch, shape.seq);
    let inputs = step_inputs(&batch, workload, (shape.batch, shape.seq), &device)?;
    let mut losses = Vec::new();
    let mut graph = GraphSize::default();
    for _ in 0..shape.warmup {
        losses.push(
            full_step(
                &model,
                &mut optimizer,
                &inputs,
                loss_head,
                &lm_head,
                Some(&mut graph),
            )?
            .0,
        );
    }
    let load_start = load_average();
    let cpu_start = process_cpu_seconds();
    let (mut times, mut all_pieces) = (Vec::new(), Vec::new());
    for _ in 0..shape.timed {
        let start = Instant::now();
        let (loss, pieces) = full_step(&model, &mut optimizer, &inputs, loss_head, &lm_head, None)?;
        times.push(start.elapsed().as_secs_f64());
        losses.push(loss);
        all_pieces.push(pieces);
    }
    let cpu = process_cpu_seconds() - cpu_start;
    let total: f64 = times.iter().sum();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let piece_ms = |f: fn(&Pieces) -> f64| median(all_pieces.iter().map(f).collect()) * 1e3;
    let tokens_per_step = (shape.batch * shape.seq) as f64;
    Ok(json!({
        "workload": workload,
        "loss_head": format!("{loss_head:?}").to_lowercase(),
        "batch": shape.batch,
        "seq": shape.seq,
        "warmup_steps": shape.warmup,
        "timed_steps": shape.timed,
        "documents": inputs.documents,
        "loss_tokens_per_step": inputs.loss_tokens,
        "id_sum": inputs.id_sum,
        "step_seconds": times,
        "tokens_per_second": tokens_per_step * shape.timed as f64 / total,
        "tokens_per_second_median_step": tokens_per_step / median(times.clone()),
        "median_piece_ms": {
            "forward": piece_ms(|p| p.forward),
            "loss": piece_ms(|p| p.loss),
            "backward": piece_ms(|p| p.backward),
            "optimizer": piece_ms(|p| p.optimizer),
        },
        "cpu_per_wall": cpu / total,
        "graph_nodes": graph.nodes,
        "graph_node_elements": graph.elements,
        "graph_nodes_by_shape": graph.by_shape.iter().take(12)
            .map(|(shape, count)| format!("{shape:?} x{count}")).collect::<Vec<_>>(),
        "load_average_at_start": load_start,
        "load_average_at_end": load_average(),
        "losses": losses,
    }))
}

/// The process's peak resident set (`VmHWM` in /proc/self/status), bytes; None elsewhere.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
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

fn env_threads(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// User + system CPU time of this process, from /proc/self/stat (fields 14 and 15, in clock
/// ticks; 100 per second on Linux). NaN where /proc is unavailable.
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
    // After the ")" field 3 (state) is index 0, so utime (14) is index 11 and stime (15) index 12.
    (ticks(11) + ticks(12)) / 100.0
}

/// The kernels chosen on this CPU (`stoke_ops::dispatch::chosen`), as a JSON object.
fn kernels() -> Value {
    let chosen = stoke_ops::dispatch::chosen().into_iter();
    let object = chosen.map(|(key, value)| (key.to_string(), Value::String(value)));
    Value::Object(object.collect())
}
