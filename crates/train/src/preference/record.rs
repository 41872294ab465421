//! `stoke dpo`'s line of `metrics.jsonl`: one typed record per step, written through the shared
//! metrics log (`metrics::RunLog`: fsync, resume truncation, torn-line recovery, TensorBoard).
//!
//! What it is not: the step's computation (`train`) or its charts (`report`).
//!
//! Invariants: the loss's figures keep TRL's names (`rewards/margins`, `logps/chosen`, ...) as
//! top-level keys; a non-finite figure is written as `null` (the report and the TensorBoard
//! scalars leave it out), as `stoke dpo` always wrote it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::train::PairStepReport;
use crate::metrics::{LogRecord, json_float};
use crate::step::StepOutcome;

/// One line of `stoke dpo`'s `metrics.jsonl`, tagged by `"kind"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PairRecord {
    Step(PairStepRecord),
    /// What the shared monitor's alert rules raised (a loss spike, a throughput drop).
    Alert {
        step: u64,
        message: String,
    },
}

impl LogRecord for PairRecord {
    fn step(&self) -> u64 {
        match self {
            PairRecord::Step(record) => record.step,
            PairRecord::Alert { step, .. } => *step,
        }
    }
}

/// The figures of one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairStepRecord {
    pub step: u64,
    pub epoch: u64,
    pub outcome: StepOutcome,
    #[serde(with = "json_float")]
    pub loss: f64,
    #[serde(with = "json_float")]
    pub grad_norm: f64,
    #[serde(with = "json_float")]
    pub lr: f64,
    pub pairs: usize,
    /// Prompt and response tokens of the step's sequences.
    pub tokens: usize,
    #[serde(with = "json_float")]
    pub tokens_per_s: f64,
    #[serde(with = "json_float")]
    pub seconds: f64,
    /// The loss's figures under TRL's names; `None` for a non-finite value.
    #[serde(flatten)]
    pub metrics: BTreeMap<String, Option<f64>>,
}

impl PairStepRecord {
    pub fn from_report(report: &PairStepReport) -> PairStepRecord {
        PairStepRecord {
            step: report.step,
            epoch: report.epoch,
            outcome: report.outcome,
            loss: report.loss,
            grad_norm: report.grad_norm,
            lr: report.lr,
            pairs: report.pairs,
            tokens: report.tokens,
            tokens_per_s: report.tokens as f64 / report.seconds.max(1e-9),
            seconds: report.seconds,
            metrics: report
                .metrics
                .iter()
                .map(|(name, value)| (name.to_string(), value.is_finite().then_some(*value)))
                .collect(),
        }
    }

    /// A figure by its TRL name (NaN when it was non-finite; `None` when not logged).
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics.get(name).map(|v| v.unwrap_or(f64::NAN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_round_trips_with_trl_names_at_the_top_level() {
        let report = PairStepReport {
            step: 3,
            epoch: 1,
            outcome: StepOutcome::Applied,
            loss: 0.5,
            grad_norm: f64::NAN,
            lr: 1e-6,
            metrics: vec![("rewards/margins", 0.25), ("logps/chosen", f64::NAN)],
            pairs: 4,
            tokens: 400,
            seconds: 0.5,
        };
        let record = PairRecord::Step(PairStepRecord::from_report(&report));
        let text = serde_json::to_string(&record).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["kind"], "step");
        assert_eq!(value["rewards/margins"], 0.25);
        assert!(value["logps/chosen"].is_null(), "{text}");
        assert_eq!(value["grad_norm"], "NaN");
        let back: PairRecord = serde_json::from_str(&text).unwrap();
        let PairRecord::Step(back) = back else {
            panic!("a step record")
        };
        assert_eq!(back.metric("rewards/margins"), Some(0.25));
        assert!(back.metric("logps/chosen").unwrap().is_nan());
        assert!(back.grad_norm.is_nan());
        assert_eq!(back.step, 3);
    }
}
