//! The speedrun's typed summary, written as `<out>/speedrun.json`: every stage's figures, the
//! accuracy of each evaluated model and the stage timings. The integration test and the report
//! card read these records; nothing else is needed to judge a run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;
use stoke_eval::accuracy::{AccuracyReport, LevelAccuracy, SampleRecord};

use super::agent::AgentStageSummary;
use super::data::DataStats;
use super::distill::DistillStageSummary;
use super::preference::PreferenceStageSummary;
use super::rl::GrpoStageSummary;
use super::shards::ShardStats;
use super::tokenizer::TokenizerStats;
use super::training::TrainingStageSummary;

/// Wall-clock time of one stage.
#[derive(Clone, Debug, Serialize)]
pub struct StageTiming {
    pub stage: &'static str,
    pub seconds: f64,
}

impl StageTiming {
    pub fn done(stage: &'static str, started: Instant) -> StageTiming {
        StageTiming {
            stage,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// Held-out accuracy of one model (its completions are in `samples_file`).
#[derive(Clone, Debug, Serialize)]
pub struct ModelEvaluation {
    pub label: String,
    pub model_dir: PathBuf,
    pub samples: usize,
    pub accuracy: f64,
    pub flexible_accuracy: f64,
    pub format_rate: f64,
    pub by_level: Vec<LevelAccuracy>,
    pub generated_tokens: usize,
    pub seconds: f64,
    pub samples_file: PathBuf,
    /// The first completions, for the report card.
    #[serde(skip)]
    pub examples: Vec<SampleRecord>,
}

impl ModelEvaluation {
    /// Keeps the figures and writes every sample to `<eval_dir>/<label>.jsonl`.
    pub fn record(
        label: &str,
        model_dir: &Path,
        report: AccuracyReport,
        eval_dir: &Path,
    ) -> anyhow::Result<ModelEvaluation> {
        std::fs::create_dir_all(eval_dir)
            .with_context(|| format!("creating {}", eval_dir.display()))?;
        let samples_file = eval_dir.join(format!("{label}.jsonl"));
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(&samples_file)
                .with_context(|| format!("creating {}", samples_file.display()))?,
        );
        for record in &report.records {
            writeln!(file, "{}", serde_json::to_string(record)?)
                .with_context(|| format!("writing {}", samples_file.display()))?;
        }
        file.flush()
            .with_context(|| format!("writing {}", samples_file.display()))?;
        Ok(ModelEvaluation {
            label: label.to_string(),
            model_dir: model_dir.to_path_buf(),
            samples: report.samples,
            accuracy: report.accuracy,
            flexible_accuracy: report.flexible_accuracy,
            format_rate: report.format_rate,
            by_level: report.by_level,
            generated_tokens: report.generated_tokens,
            seconds: report.seconds,
            samples_file,
            examples: report.records,
        })
    }
}

/// Everything a speedrun produced.
#[derive(Clone, Debug, Serialize)]
pub struct SpeedrunSummary {
    pub recipe: String,
    pub seed: u64,
    pub out_dir: PathBuf,
    pub data: DataStats,
    pub tokenizer: TokenizerStats,
    pub shards: ShardStats,
    pub pretrain: TrainingStageSummary,
    pub sft: TrainingStageSummary,
    pub preference: PreferenceStageSummary,
    pub grpo: GrpoStageSummary,
    /// The agent stage, with its own held-out evaluations (calculator problems, episodes).
    pub agent: AgentStageSummary,
    pub distill: DistillStageSummary,
    /// In pipeline order: the pretrained model, the SFT model, the preference-optimized models
    /// (one per loss, labelled by TRL's loss name), the GRPO model, then the distillation
    /// stage's students: SFT only, after the offline phase, distilled.
    pub evaluations: Vec<ModelEvaluation>,
    pub final_model: PathBuf,
    pub report: PathBuf,
    pub stages: Vec<StageTiming>,
    pub total_seconds: f64,
}

impl SpeedrunSummary {
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }
}
