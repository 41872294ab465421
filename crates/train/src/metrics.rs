//! Training metrics as typed records, and the append-only JSONL log they are written to.
//!
//! What it is: the records a run emits (`StepMetrics` per optimizer step, `EvalMetrics` per
//! evaluation, alerts), `MetricsLog` (`stoke train`'s instance of [`RunLog`], the one metrics log
//! every command writes, with TensorBoard event files beside it: see `log`, `tensorboard`), the MFU
//! estimate with the matmul peak it is measured against, and `ThroughputTracker` (a running median
//! of tokens/s that the monitor's throughput alert compares against).
//! What it is not: it neither prints (monitor.rs) nor draws (report.rs), and it does not decide
//! what a spike is (monitor.rs, and the trainer's spike handling in spike.rs).
//!
//! Invariants:
//! - The log's append, durability, resume and torn-line rules are `log`'s: one writer and one
//!   reader for every command.
//! - Non-finite floats survive the round trip: JSON has no NaN/Infinity, so they are written as the
//!   strings `"NaN"`, `"Infinity"`, `"-Infinity"` (and `null` reads back as NaN). A step with a
//!   NaN loss is exactly the record a person wants to find in the log.

mod log;
pub mod tensorboard;

pub use log::{LogRecord, RunLog, scalars};

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Errors of the metrics log, the peak-FLOP/s measurement and the run report.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("metrics file {path}, line {line}: {message}")]
    BadLine {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("cannot encode metric record: {0}")]
    Encode(serde_json::Error),
    #[error("chart {title:?}: {message}")]
    Chart { title: String, message: String },
    #[error("peak FLOP/s measurement failed: {0}")]
    Measure(#[from] candle_core::Error),
}

impl MetricsError {
    fn io(path: &Path, source: std::io::Error) -> MetricsError {
        MetricsError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Figures of one optimizer step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimizer steps completed, counting this one (the first step is 1).
    pub step: u64,
    #[serde(with = "json_float")]
    pub loss: f64,
    /// Learning rate applied in this step (peak lr times the schedule's factor).
    #[serde(with = "json_float")]
    pub lr: f64,
    /// Global gradient norm before clipping.
    #[serde(with = "json_float")]
    pub grad_norm: f64,
    #[serde(with = "json_float")]
    pub tokens_per_s: f64,
    pub tokens_seen: u64,
    /// Model FLOP utilisation, see [`mfu`].
    #[serde(with = "json_float")]
    pub mfu: f64,
    /// Wall-clock seconds since the run (or its resumed part) started.
    #[serde(with = "json_float")]
    pub elapsed_s: f64,
    /// The update was not applied (loss spike or non-finite gradient).
    pub skipped: bool,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json_float_opt"
    )]
    pub z_loss: Option<f64>,
    /// Where the memory went (see [`MemoryReport`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryReport>,
    /// Mixture-of-experts load (MoE models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeMetrics>,
    /// MuonClip: the step's largest attention logit, before the clip.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json_float_opt"
    )]
    pub max_attn_logit: Option<f64>,
    /// MuonClip: heads whose query/key projections the step scaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_clipped_heads: Option<u64>,
    /// Multi-token prediction: the modules' mean cross-entropy per prediction (models with MTP
    /// modules trained under `training.mtp_loss_weight`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json_float_opt"
    )]
    pub mtp_loss: Option<f64>,
}

impl StepMetrics {
    /// The figures every command's step has, for the commands whose own step records feed the
    /// shared monitor and report (`stoke dpo`, `stoke grpo`): MFU not measured (NaN: left out),
    /// none of the optional figures, no throughput yet ([`StepMetrics::with_progress`]).
    pub fn basic(step: u64, loss: f64, lr: f64, grad_norm: f64, skipped: bool) -> StepMetrics {
        StepMetrics {
            step,
            loss,
            lr,
            grad_norm,
            tokens_per_s: f64::NAN,
            tokens_seen: 0,
            mfu: f64::NAN,
            elapsed_s: f64::NAN,
            skipped,
            z_loss: None,
            memory: None,
            moe: None,
            max_attn_logit: None,
            qk_clipped_heads: None,
            mtp_loss: None,
        }
    }

    /// The step with its throughput, the tokens seen so far and the seconds since the run (or
    /// its resumed part) started.
    pub fn with_progress(self, tokens_per_s: f64, tokens_seen: u64, elapsed_s: f64) -> StepMetrics {
        StepMetrics {
            tokens_per_s,
            tokens_seen,
            elapsed_s,
            ..self
        }
    }
}

/// A step's expert load: MaxVio per MoE layer and its worst, the mean violation, each expert's
/// share of the slots per layer, and the auxiliary loss when it is on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeMetrics {
    /// The largest MaxVio over the MoE layers (`(max load - mean) / mean`; 0 is balanced).
    #[serde(with = "json_float")]
    pub max_violation: f64,
    /// The mean over the layers of the mean absolute violation.
    #[serde(with = "json_float")]
    pub mean_violation: f64,
    /// Per MoE layer: the layer index and each expert's share of the step's slots.
    pub expert_load: Vec<(usize, Vec<f64>)>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json_float_opt"
    )]
    pub aux_loss: Option<f64>,
    /// The share of the step's (token, slot) pairs an expert capacity dropped (with
    /// `training.moe.capacity_factor`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json_float_opt"
    )]
    pub dropped_share: Option<f64>,
}

impl MoeMetrics {
    /// The figures of a step's per-layer counts; `None` without MoE layers.
    pub fn from_counts(counts: &[(usize, Vec<u64>)], aux_loss: Option<f64>) -> Option<MoeMetrics> {
        if counts.is_empty() {
            return None;
        }
        let loads: Vec<(usize, stoke_model::moe::ExpertLoad)> = counts
            .iter()
            .map(|(layer, c)| (*layer, stoke_model::moe::ExpertLoad { counts: c.clone() }))
            .collect();
        Some(MoeMetrics {
            max_violation: loads
                .iter()
                .map(|(_, l)| l.max_violation())
                .fold(0.0, f64::max),
            mean_violation: loads.iter().map(|(_, l)| l.mean_violation()).sum::<f64>()
                / loads.len() as f64,
            expert_load: loads
                .iter()
                .map(|(layer, l)| (*layer, l.fractions()))
                .collect(),
            aux_loss,
            dropped_share: None,
        })
    }
}

/// Bytes by stage at a step. Weights, gradients and optimizer state are counted exactly from
/// the tensors; the rest of the process's peak (activations, KV cache, temporaries, allocator
/// slack) is what the peak resident set leaves, so `activations_bytes` is an upper bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Every parameter (a frozen LoRA base included) plus bf16 copies packed for inference.
    pub weights_bytes: u64,
    /// One f32 gradient per trainable element (held from the backward pass to the update).
    pub gradients_bytes: u64,
    /// Optimizer state (moments, momentum, 8-bit codes and scales).
    pub optimizer_bytes: u64,
    /// The process's peak resident set so far (`VmHWM`; 0 where unavailable).
    pub peak_rss_bytes: u64,
    /// `peak_rss - weights - gradients - optimizer - kv_cache`: activations and everything else
    /// at the peak.
    pub activations_bytes: u64,
    /// The largest KV cache generation held so far (GRPO rollouts; 0 where nothing generates).
    #[serde(default)]
    pub kv_cache_bytes: u64,
}

impl MemoryReport {
    /// The report for a model and its optimizer, with the process's current peak.
    pub fn measure(model: &stoke_model::Transformer, optimizer: &stoke_optim::Optimizer) -> Self {
        let bytes = |vars: &[(String, candle_core::Var)]| -> u64 {
            vars.iter()
                .map(|(_, v)| (v.elem_count() * v.dtype().size_in_bytes()) as u64)
                .sum()
        };
        let weights_bytes = bytes(&model.parameters())
            + model
                .lora_config()
                .map_or(0, |_| bytes(&model.trainable_parameters()))
            + model.packed_weight_bytes() as u64;
        let gradients_bytes = bytes(optimizer.params());
        let optimizer_bytes = optimizer.state_bytes() as u64;
        let peak_rss_bytes = peak_rss_bytes().unwrap_or(0);
        MemoryReport {
            weights_bytes,
            gradients_bytes,
            optimizer_bytes,
            peak_rss_bytes,
            activations_bytes: peak_rss_bytes
                .saturating_sub(weights_bytes + gradients_bytes + optimizer_bytes),
            kv_cache_bytes: 0,
        }
    }

    /// With the KV cache counted as its own stage (taken out of `activations_bytes`).
    pub fn with_kv_cache(mut self, bytes: u64) -> Self {
        self.kv_cache_bytes = bytes;
        self.activations_bytes = self.activations_bytes.saturating_sub(bytes);
        self
    }
}

/// The process's peak resident set (`VmHWM` in /proc/self/status), bytes; None elsewhere.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Figures of one evaluation on the held-out set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    pub step: u64,
    #[serde(with = "json_float")]
    pub loss: f64,
    #[serde(with = "json_float")]
    pub bits_per_byte: f64,
    /// Tokens the evaluation scored.
    pub tokens: u64,
}

/// One line of `metrics.jsonl`, tagged by `"kind"`.
// Records are written and read one at a time: the size difference between the variants costs
// nothing, and a boxed step would change every construction site.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MetricRecord {
    Step(StepMetrics),
    Eval(EvalMetrics),
    Alert { step: u64, message: String },
}

impl MetricRecord {
    /// The optimizer step the record belongs to.
    pub fn step(&self) -> u64 {
        match self {
            MetricRecord::Step(m) => m.step,
            MetricRecord::Eval(m) => m.step,
            MetricRecord::Alert { step, .. } => *step,
        }
    }
}

impl LogRecord for MetricRecord {
    fn step(&self) -> u64 {
        MetricRecord::step(self)
    }
}

/// `stoke train`'s metrics log (the shared [`RunLog`] over [`MetricRecord`]).
pub type MetricsLog = RunLog<MetricRecord>;

/// Model FLOP utilisation: `6 * num_params * tokens_per_s / peak_flops` (forward + backward of a
/// dense transformer, attention FLOPs left out, as in the PaLM and nanoGPT estimates).
/// Returns 0 when `peak_flops` is not a positive finite number.
pub fn mfu(num_params: u64, tokens_per_s: f64, peak_flops: f64) -> f64 {
    if !(peak_flops.is_finite() && peak_flops > 0.0) {
        return 0.0;
    }
    6.0 * num_params as f64 * tokens_per_s / peak_flops
}

/// Measures this machine's f32 matmul rate in FLOP/s on candle's CPU backend.
///
/// CPUs have no single published peak the way accelerators do, so stoke's MFU on CPU is relative to
/// this measured rate: square 1024x1024 f32 matmuls on the threads candle computes on, repeated for
/// about 0.2 s after one warm-up, and the fastest repetition taken (the machine is often shared, and
/// the fastest one is closest to what the hardware can do). An MFU near 1 means the training step
/// runs as fast as a large plain matmul, not that the chip's vector units are saturated.
pub fn measure_peak_flops() -> Result<f64, MetricsError> {
    measure_peak_flops_for(1024, Duration::from_millis(200))
}

/// [`measure_peak_flops`] with the matrix side and time budget given.
pub fn measure_peak_flops_for(size: usize, budget: Duration) -> Result<f64, MetricsError> {
    use candle_core::{Device, Tensor};
    let size = size.max(1);
    let device = Device::Cpu;
    // Values in [0, 1): no subnormals or overflow to distort the timing.
    let a = Tensor::rand(0f32, 1f32, (size, size), &device)?;
    let b = Tensor::rand(0f32, 1f32, (size, size), &device)?;
    let flops_per_matmul = 2.0 * (size as f64).powi(3);
    // Warm-up: first-touch page faults and thread-pool start-up.
    a.matmul(&b)?;
    let start = Instant::now();
    let mut best = 0.0f64;
    let mut repetitions = 0;
    while repetitions < 3 || start.elapsed() < budget {
        let t = Instant::now();
        let c = a.matmul(&b)?;
        // Read one value so the product is certainly computed before the clock stops.
        c.narrow(0, 0, 1)?
            .narrow(1, 0, 1)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let seconds = t.elapsed().as_secs_f64().max(1e-9);
        best = best.max(flops_per_matmul / seconds);
        repetitions += 1;
    }
    Ok(best)
}

/// Running median of the last `window` throughput samples.
///
/// The median, not the mean: one slow step (a checkpoint write, an evaluation) must not drag the
/// reference down, and one fast outlier must not make every following step look slow.
#[derive(Clone, Debug)]
pub struct ThroughputTracker {
    window: usize,
    samples: VecDeque<f64>,
}

impl ThroughputTracker {
    pub fn new(window: usize) -> ThroughputTracker {
        let window = window.max(1);
        ThroughputTracker {
            window,
            samples: VecDeque::with_capacity(window),
        }
    }

    /// Adds a sample; non-finite and negative values are ignored (they carry no throughput).
    pub fn push(&mut self, tokens_per_s: f64) {
        if !(tokens_per_s.is_finite() && tokens_per_s >= 0.0) {
            return;
        }
        if self.samples.len() == self.window {
            self.samples.pop_front();
        }
        self.samples.push_back(tokens_per_s);
    }

    /// Samples currently in the window.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Median of the window (mean of the middle two for an even count), None when empty.
    pub fn median(&self) -> Option<f64> {
        if self.samples.is_empty() {
            return None;
        }
        let mut sorted: Vec<f64> = self.samples.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        Some(if sorted.len() % 2 == 1 {
            sorted[mid]
        } else {
            0.5 * (sorted[mid - 1] + sorted[mid])
        })
    }

    /// `tokens_per_s / median`, None while the window holds fewer than `min_samples` samples or
    /// the median is zero.
    pub fn ratio_to_median(&self, tokens_per_s: f64, min_samples: usize) -> Option<f64> {
        if self.samples.len() < min_samples.max(1) {
            return None;
        }
        let median = self.median()?;
        (median > 0.0).then(|| tokens_per_s / median)
    }
}

/// serde for f64 fields that may be NaN or infinite (see the module doc): written as the strings
/// `"NaN"`, `"Infinity"`, `"-Infinity"`, read back from them (and from null as NaN).
pub mod json_float {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Text(String),
        Null(()),
    }

    pub fn serialize<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
        if value.is_nan() {
            serializer.serialize_str("NaN")
        } else if *value == f64::INFINITY {
            serializer.serialize_str("Infinity")
        } else if *value == f64::NEG_INFINITY {
            serializer.serialize_str("-Infinity")
        } else {
            serializer.serialize_f64(*value)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        match Repr::deserialize(deserializer)? {
            Repr::Number(v) => Ok(v),
            Repr::Null(()) => Ok(f64::NAN),
            Repr::Text(text) => match text.as_str() {
                "NaN" => Ok(f64::NAN),
                "Infinity" => Ok(f64::INFINITY),
                "-Infinity" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!(
                    "expected a number, \"NaN\", \"Infinity\" or \"-Infinity\", found {other:?}"
                ))),
            },
        }
    }
}

/// `json_float` for `Option<f64>` (absent or null = None).
pub mod json_float_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<f64>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => super::json_float::serialize(v, serializer),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<f64>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Number(f64),
            Text(String),
            Null(()),
        }
        match Repr::deserialize(deserializer)? {
            Repr::Number(v) => Ok(Some(v)),
            Repr::Null(()) => Ok(None),
            Repr::Text(text) => match text.as_str() {
                "NaN" => Ok(Some(f64::NAN)),
                "Infinity" => Ok(Some(f64::INFINITY)),
                "-Infinity" => Ok(Some(f64::NEG_INFINITY)),
                other => Err(serde::de::Error::custom(format!(
                    "expected a number, null, \"NaN\", \"Infinity\" or \"-Infinity\", found {other:?}"
                ))),
            },
        }
    }
}

/// A finite figure with 4 significant digits, in scientific notation below 1e-3 or from
/// `scientific_from` up (shared by the console lines and the report).
pub fn format_significant(value: f64, scientific_from: f64) -> String {
    let magnitude = value.abs();
    if magnitude != 0.0 && !(1e-3..scientific_from).contains(&magnitude) {
        format!("{value:.3e}")
    } else {
        let decimals = if magnitude == 0.0 {
            0
        } else {
            (3 - magnitude.log10().floor() as i32).max(0)
        };
        format!("{value:.*}", decimals as usize)
    }
}
