//! Speedrun stages 4 and 5 (and any later training stage): one call of the trainer
//! (`stoke_train::run::run`) on a config from the recipe, summarized from its metrics log.
//!
//! What it is: the seam between the speedrun and the trainer. A stage is a [`TrainStage`] name,
//! a resolved `TrainConfig` and the folder it writes; the result is a [`TrainingStageSummary`]
//! with the loss curve, so adding a stage (GRPO after SFT) is one more call that hands the
//! previous stage's model folder to the next. What it is not: a trainer; everything about the
//! loop lives in stoke-train.

use std::path::PathBuf;

use anyhow::Context;
use serde::Serialize;
use stoke_train::config::TrainConfig;
use stoke_train::metrics::{MetricRecord, MetricsLog};
use stoke_train::run::{RunOptions, run};

/// The training stages of the pipeline, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainStage {
    Pretrain,
    Sft,
}

impl TrainStage {
    pub fn title(self) -> &'static str {
        match self {
            TrainStage::Pretrain => "pretraining",
            TrainStage::Sft => "supervised fine-tuning",
        }
    }
}

/// What one training stage did.
#[derive(Clone, Debug, Serialize)]
pub struct TrainingStageSummary {
    pub stage: TrainStage,
    pub run_dir: PathBuf,
    pub model_dir: PathBuf,
    pub report: Option<PathBuf>,
    pub parameters: usize,
    pub steps: u64,
    pub tokens_seen: u64,
    pub tokens_per_s: f64,
    pub seconds: f64,
    /// Loss of the first optimizer step (the untrained model on its first batch).
    pub initial_loss: f64,
    /// Mean loss of the last 10% of steps (at least 1): one batch is noisy.
    pub final_loss: f64,
    /// (step, held-out loss) at every evaluation.
    pub eval_losses: Vec<(u64, f64)>,
    /// (step, training loss) of every step, for the charts.
    #[serde(skip)]
    pub train_losses: Vec<(u64, f64)>,
    /// (step, learning rate).
    #[serde(skip)]
    pub learning_rates: Vec<(u64, f64)>,
}

/// Runs one training stage and reads back its metrics.
pub fn train(stage: TrainStage, config: TrainConfig) -> anyhow::Result<TrainingStageSummary> {
    let options = RunOptions {
        resume: false,
        quiet: false,
        measure_mfu: false,
        write_report: true,
    };
    let summary = run(config, options).with_context(|| format!("the {} stage", stage.title()))?;
    let metrics_path = summary.run_dir.join("metrics.jsonl");
    let records = MetricsLog::read_all(&metrics_path)
        .with_context(|| format!("reading {}", metrics_path.display()))?;
    let mut train_losses = Vec::new();
    let mut learning_rates = Vec::new();
    let mut eval_losses = Vec::new();
    for record in &records {
        match record {
            MetricRecord::Step(m) if !m.skipped => {
                train_losses.push((m.step, m.loss));
                learning_rates.push((m.step, m.lr));
            }
            MetricRecord::Eval(m) => eval_losses.push((m.step, m.loss)),
            _ => {}
        }
    }
    let initial_loss = train_losses.first().map_or(f64::NAN, |&(_, l)| l);
    let tail = (train_losses.len() / 10).max(1).min(train_losses.len());
    let final_loss = if tail == 0 {
        f64::NAN
    } else {
        train_losses[train_losses.len() - tail..]
            .iter()
            .map(|&(_, l)| l)
            .sum::<f64>()
            / tail as f64
    };
    let parameters = stoke_model::ModelConfig::from_file(&summary.model_dir.join("config.json"))
        .map(|c| c.num_parameters())
        .unwrap_or(0);
    Ok(TrainingStageSummary {
        stage,
        run_dir: summary.run_dir,
        model_dir: summary.model_dir,
        report: summary.report,
        parameters,
        steps: summary.steps,
        tokens_seen: summary.tokens_seen,
        tokens_per_s: summary.tokens_per_s,
        seconds: summary.elapsed_s,
        initial_loss,
        final_loss,
        eval_losses,
        train_losses,
        learning_rates,
    })
}
