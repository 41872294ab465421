//! The speedrun's sizes: how much data, how big a tokenizer and model, how many steps. Two
//! recipes, full (the default, about twelve minutes on two CPU cores) and quick (`--quick`, about
//! five minutes, what the integration test runs), and every other number derived from them.
//!
//! What it is: plain data plus the configs it implies, built as the commands' own typed config
//! files and written as the TOML they read (`<out>/pretrain.toml`, `<out>/sft.toml`,
//! `<out>/grpo.toml`, `<out>/dpo-<loss>.toml`, ...), so a newcomer can rerun or change one stage
//! by hand. What it is not: the stages themselves (`mod.rs` and its siblings).
//!
//! Why these sizes: the model must learn to add and subtract small numbers from text alone in a
//! few hundred steps on a CPU, so the task starts at single-digit problems (the full run adds
//! one-step problems up to 50 and times tables), the vocabulary is small (few parameters in the
//! embedding, most in the blocks), sequences are short (a worksheet is about 60-150 tokens) and the
//! learning rate is the config's size-derived default with a WSD schedule, whose long constant
//! phase suits short runs. Muon rather than AdamW: measured on the quick recipe (seed 0, same
//! steps), AdamW's SFT model reached 26% held-out accuracy and Muon's 64%.

use std::path::{Path, PathBuf};

use std::collections::BTreeMap;
use stoke_data::packing::PackingPolicy;
use stoke_eval::arithmetic::Level;

use stoke_pipeline::config::environment::EnvironmentSection;
use stoke_pipeline::config::{
    EvalSection, GrpoConfigFile, GrpoSection, LagFile, ModeFile, ModelSection, TaskSourceFile,
    TrainingSection, shortest_f64,
};
use stoke_pipeline::env_settings::{EnvironmentKind, ToolsIn};
use stoke_reward::RewardConfig;
use stoke_reward::exact_match::{ExactMatchConfig, MatchMode};
use stoke_train::config::{
    CheckpointFile, ConfigFile, DataFile, DataKind, EvalFile, ModelFile, OptimizerFile,
    OptimizerKind, ScheduleFile, ScheduleKind, TrainConfig, TrainingFile,
};
use stoke_train::grpo::opd::OpdConfig;
use stoke_train::preference::run::{
    ObjectiveFile, ObjectiveKind, PairDataFile, PairLayout, PreferenceFile, PreferenceModelFile,
    PreferenceTrainingFile, ReferenceFile, ReferenceMode,
};
use stoke_train::preference::{CpoLoss, DpoLoss, DpoLossType, KtoLoss, OrpoLoss};

/// Every size of one speedrun.
#[derive(Clone, Debug, PartialEq)]
pub struct Recipe {
    pub name: &'static str,
    pub levels: Vec<Level>,
    /// Problems in the pretraining corpus (grouped 1-3 per document).
    pub corpus_problems: usize,
    /// Held-out problems whose documents give the pretraining evaluation loss.
    pub corpus_eval_problems: usize,
    /// SFT conversations (training split).
    pub sft_problems: usize,
    /// Held-out problems for exact-match accuracy (also the SFT evaluation-loss set).
    pub held_out_problems: usize,
    /// Share of the question space reserved for held-out problems.
    pub held_out_fraction: f64,
    pub vocab_size: usize,
    pub model: ModelShape,
    pub seq_len: usize,
    pub pretrain: StageSizes,
    pub sft: StageSizes,
    pub grpo: GrpoSizes,
    pub preference: PreferenceSizes,
    pub distill: DistillSizes,
    pub agent: AgentSizes,
    /// Generation cap for the accuracy evaluation (a worked solution is 20-45 tokens).
    pub eval_max_new_tokens: usize,
    pub eval_batch_size: usize,
    /// Sample completions shown per model in the report card.
    pub report_samples: usize,
}

/// The GRPO stage's sizes (on the SFT model, arithmetic tasks of the training split, the
/// exact-match reward; AdamW with a cosine decay to 0 over the steps). Measured on the quick
/// recipe (seed 0, fixed lag, so every run repeats): at a constant lr 3e-5 greedy held-out
/// accuracy went 64% -> 76% (step 50) -> 78% (100) -> 67% (200), overshooting; the cosine decay
/// over 200 updates holds it at 75% (sampled pass@1 42% -> 53%). Earlier (bounded lag): 1e-4
/// gave 66% and 3e-4 fell to 36%; temperature 1.0 at 3e-5 gave 71%.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GrpoSizes {
    pub steps: u64,
    pub prompts_per_step: usize,
    pub group_size: usize,
    pub lr: f64,
    pub temperature: f32,
    /// Training-split problems the prompts are drawn from.
    pub problems: usize,
    pub eval_every: u64,
    /// Held-out problems of the in-training evaluation (the first of the held-out set; greedy
    /// plus 4 samples each, so fewer than the final evaluation's).
    pub eval_problems: usize,
}

/// The preference stage's sizes: `samples` answers sampled from the SFT model for each of
/// `prompts` training-split questions, correct paired against wrong, and one run of each loss
/// (TRL's `loss_type` names) on the pairs, AdamW with a cosine decay to 0. Measured on the quick
/// recipe (256 x 8 samples at temperature 1.0, 38% correct, 637 pairs; held-out accuracy on 1,000
/// problems, SFT 65.8%): beta 5, lr 2e-5, 320 steps of 8 pairs (4 epochs) gave sigmoid 69.6% /
/// 70.1% / 70.3% and APO-zero 68.9% / 69.6% / 70.1% (training seeds 0 / 1 / 2). TRL's default
/// beta 0.1 erases what SFT built: 65% at lr 1e-5 for 60 steps, 54% for 160 steps, 27% at 1e-4,
/// the rejected log-probs falling far and the chosen with them (likelihood displacement). Half the
/// "correct" samples are right by luck (`3 + 3 = 5 ... #### 6`: the exact-match verifier sees
/// only the final answer), so the pairs are noisy and a large beta, which stops pushing a pair
/// once its margin is a few nats, is what keeps them from doing harm. Samples at temperature
/// 0.7 made worse pairs (67% at best, beta 2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PreferenceSizes {
    pub prompts: usize,
    pub samples: usize,
    pub temperature: f32,
    pub losses: &'static [&'static str],
    pub steps: u64,
    pub pairs_per_micro_batch: usize,
    pub lr: f64,
    pub beta: f64,
}

impl PreferenceSizes {
    /// The full and the quick recipe's preference stage (the same sizes; see the type's doc).
    pub const BOTH_RECIPES: PreferenceSizes = PreferenceSizes {
        prompts: 256,
        samples: 8,
        temperature: 1.0,
        losses: &["sigmoid", "apo_zero"],
        steps: 320,
        pairs_per_micro_batch: 8,
        lr: 2e-5,
        beta: 5.0,
    };
}

/// The distillation stage's sizes (see `distill.rs`): the student owns the first `labels` SFT
/// conversations; the teacher (the GRPO model) answers each GRPO question once at
/// `teacher_temperature`; the distilled student trains `offline_steps` SFT steps on labels plus
/// teacher replies, then `on_policy_steps` updates of on-policy distillation (the GRPO stage's
/// prompts, group size and temperature, AdamW at `on_policy_lr` with a cosine decay); the SFT-only
/// student trains `offline_steps + on_policy_steps` SFT steps on the labels.
///
/// Measured on the quick recipe (1,000 held-out problems, a one-layer student from the pretrained
/// model, 200 labels; seed 0 / seed 1): teacher 77.5% / 79.8%; SFT alone, 280 steps, 55.5% /
/// 62.9%. Offline phase (180 steps) with teacher replies at temperature 0.1: 76.9% / 77.6%; at 0.3,
/// 72.2% / 73.3% (fewer replies right: 69% against 76%). The on-policy phase then, at lr 3e-5:
/// 77.0% / 75.4%; at 1e-4: 72.2% / 73.1%; sampling at temperature 0.3, lr 1e-4: 75.1% / 74.9%.
/// Once the offline phase has brought the student level with its teacher, on-policy distillation
/// holds it there at a gentle lr and costs points at a larger one. Verified teacher replies
/// (seed 0: 85.2%, past the teacher) are not used: the verifier adds answers the SFT-only student
/// never gets, so the comparison would no longer isolate the teacher.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DistillSizes {
    pub labels: usize,
    pub teacher_temperature: f32,
    pub offline_steps: u64,
    pub on_policy_steps: u64,
    pub on_policy_lr: f64,
}

/// The agent stage's sizes (see `agent.rs`): `traces` ideal calculator conversations (call the
/// tool, read its result, answer) for `sft` steps of SFT on the speedrun's SFT model, then
/// multi-turn GRPO in the calculator environment (at most `max_turns` model turns of at most
/// `max_turn_tokens` each), and the final held-out evaluation on `held_out_problems` problems,
/// with and without the tool. Operands have `digits` digits: the speedrun's model, which adds
/// single digits, cannot multiply three-digit numbers in its head, and the tool makes it a copying
/// task (the expression into the call, the result into the answer).
///
/// Measured on the quick recipe (seed 0; in-run held-out greedy accuracy with the tool on 200
/// problems): after 150 SFT steps the model miscopied most expressions (a tool call is about 75
/// ids of this tokenizer, which never saw JSON). With 400 steps SFT reached 91.5% and GRPO (150
/// updates of 8 x 8, lr 1e-4, temperature 0.7) 94.5% (1,000 problems: 90.6% -> 93.6%): too
/// little room left for RL to show. With 250 steps, 80.5% -> 86.5%. lr 5e-5 moved slower (3-5
/// points in 100 updates from a 66% start); temperature 1.0 gave the same as 0.7.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgentSizes {
    pub digits: u32,
    pub traces: usize,
    pub sft: StageSizes,
    pub grpo: GrpoSizes,
    pub max_turns: usize,
    pub max_turn_tokens: usize,
    pub held_out_problems: usize,
}

impl AgentSizes {
    /// The full and the quick recipe's agent stage (the same sizes; see the type's doc).
    pub const BOTH_RECIPES: AgentSizes = AgentSizes {
        digits: 3,
        traces: 3_000,
        sft: StageSizes {
            steps: 250,
            micro_batch_size: 8,
            optimizer: OptimizerKind::Muon,
            lr: None,
            eval_every: 100,
        },
        grpo: GrpoSizes {
            steps: 150,
            prompts_per_step: 8,
            group_size: 8,
            lr: 1e-4,
            temperature: 0.7,
            problems: 2_000,
            eval_every: 50,
            eval_problems: 200,
        },
        max_turns: 3,
        max_turn_tokens: 96,
        held_out_problems: 1_000,
    };
}

/// A small Llama: RMSNorm, RoPE, SwiGLU, grouped-query attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
}

/// One training stage's length and batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageSizes {
    pub steps: u64,
    pub micro_batch_size: usize,
    pub optimizer: OptimizerKind,
    /// None: the trainer's size-derived default.
    pub lr: Option<f64>,
    pub eval_every: u64,
}

impl Recipe {
    /// The default run (about twelve minutes on a 2-core CPU).
    pub fn full() -> Recipe {
        Recipe {
            name: "full",
            levels: vec![Level::SingleDigit, Level::OneStep],
            corpus_problems: 20_000,
            corpus_eval_problems: 200,
            sft_problems: 4_000,
            // 1,000 held-out problems, as in the quick recipe: on 200 the standard error of an
            // accuracy near 75% is about 3 points, more than one stage's effect.
            held_out_problems: 1_000,
            held_out_fraction: 0.1,
            vocab_size: 768,
            model: ModelShape {
                hidden: 192,
                layers: 3,
                heads: 3,
                kv_heads: 3,
                intermediate: 512,
            },
            seq_len: 256,
            pretrain: StageSizes {
                steps: 400,
                micro_batch_size: 8,
                optimizer: OptimizerKind::Muon,
                lr: None,
                eval_every: 100,
            },
            sft: StageSizes {
                steps: 150,
                micro_batch_size: 8,
                optimizer: OptimizerKind::Muon,
                lr: None,
                eval_every: 50,
            },
            grpo: GrpoSizes {
                steps: 200,
                prompts_per_step: 8,
                group_size: 8,
                lr: 3e-5,
                temperature: 0.7,
                problems: 4_000,
                eval_every: 50,
                eval_problems: 200,
            },
            preference: PreferenceSizes::BOTH_RECIPES,
            distill: DistillSizes {
                labels: 400,
                teacher_temperature: 0.1,
                offline_steps: 200,
                on_policy_steps: 100,
                on_policy_lr: 3e-5,
            },
            agent: AgentSizes::BOTH_RECIPES,
            eval_max_new_tokens: 64,
            eval_batch_size: 50,
            report_samples: 8,
        }
    }

    /// `--quick`: the same pipeline in about five minutes (the integration test).
    pub fn quick() -> Recipe {
        Recipe {
            name: "quick",
            levels: vec![Level::SingleDigit],
            corpus_problems: 6_000,
            corpus_eval_problems: 100,
            sft_problems: 2_000,
            held_out_problems: 1_000,
            held_out_fraction: 0.1,
            vocab_size: 512,
            model: ModelShape {
                hidden: 128,
                layers: 2,
                heads: 2,
                kv_heads: 2,
                intermediate: 384,
            },
            seq_len: 256,
            pretrain: StageSizes {
                steps: 150,
                micro_batch_size: 8,
                optimizer: OptimizerKind::Muon,
                lr: None,
                eval_every: 50,
            },
            sft: StageSizes {
                steps: 80,
                micro_batch_size: 8,
                optimizer: OptimizerKind::Muon,
                lr: None,
                eval_every: 40,
            },
            grpo: GrpoSizes {
                steps: 200,
                prompts_per_step: 8,
                group_size: 8,
                lr: 3e-5,
                temperature: 0.7,
                problems: 2_000,
                eval_every: 50,
                eval_problems: 100,
            },
            preference: PreferenceSizes::BOTH_RECIPES,
            distill: DistillSizes {
                labels: 200,
                teacher_temperature: 0.1,
                offline_steps: 180,
                on_policy_steps: 100,
                on_policy_lr: 3e-5,
            },
            agent: AgentSizes::BOTH_RECIPES,
            eval_max_new_tokens: 48,
            eval_batch_size: 50,
            report_samples: 6,
        }
    }

    /// The model's Hugging Face `config.json` for a tokenizer of `vocab_size` ids whose
    /// end-of-turn and end-of-text ids are `eos_token_ids`.
    pub fn model_config_json(&self, vocab_size: usize, eos_token_ids: &[u32]) -> serde_json::Value {
        let m = self.model;
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": vocab_size,
            "hidden_size": m.hidden,
            "intermediate_size": m.intermediate,
            "num_hidden_layers": m.layers,
            "num_attention_heads": m.heads,
            "num_key_value_heads": m.kv_heads,
            "head_dim": m.hidden / m.heads,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            // Tied embeddings: with a small vocabulary the saving is small, but the output head
            // then learns from every input token too, which helps the shortest runs.
            "tie_word_embeddings": true,
            "max_position_embeddings": self.seq_len.max(512),
            "eos_token_id": eos_token_ids,
        })
    }

    /// Pretraining from scratch on the token shards.
    pub fn pretrain_config(
        &self,
        paths: &StagePaths,
        seed: u64,
        checkpoint_every: u64,
    ) -> ConfigFile {
        ConfigFile {
            title: Some(format!("speedrun ({}) - pretraining", self.name)),
            output_dir: paths.run_dir.clone(),
            model: ModelFile {
                config: Some(paths.model_source.clone()),
                tokenizer: Some(paths.tokenizer.clone()),
                init_seed: Some(seed),
                ..ModelFile::default()
            },
            data: DataFile {
                kind: DataKind::Shards,
                train: vec![paths.train_data.clone()],
                eval: paths.eval_data.iter().cloned().collect(),
                seq_len: self.seq_len,
                micro_batch_size: self.pretrain.micro_batch_size,
                grad_accum_steps: Some(1),
                tokens_per_step: None,
                packing: Some(PackingPolicy::ConcatChunk),
                shuffle: Some(true),
                max_epochs: None,
            },
            optimizer: optimizer_file(&self.pretrain),
            schedule: wsd(),
            training: training_file(&self.pretrain, seed),
            eval: EvalFile {
                every: Some(self.pretrain.eval_every),
                batches: Some(4),
            },
            checkpoint: checkpoints(checkpoint_every),
            lora: None,
            distill: None,
        }
    }

    /// SFT of the pretrained model on the chat JSONL (loss on assistant tokens only).
    pub fn sft_config(&self, paths: &StagePaths, seed: u64, checkpoint_every: u64) -> ConfigFile {
        ConfigFile {
            title: Some(format!("speedrun ({}) - SFT", self.name)),
            output_dir: paths.run_dir.clone(),
            model: ModelFile {
                path: Some(paths.model_source.clone()),
                tokenizer: Some(paths.tokenizer.clone()),
                ..ModelFile::default()
            },
            data: DataFile {
                kind: DataKind::Chat,
                train: vec![paths.train_data.clone()],
                eval: paths.eval_data.iter().cloned().collect(),
                seq_len: self.seq_len,
                micro_batch_size: self.sft.micro_batch_size,
                grad_accum_steps: Some(1),
                tokens_per_step: None,
                packing: Some(PackingPolicy::BestFitDecreasing { window_docs: 256 }),
                shuffle: Some(true),
                max_epochs: None,
            },
            optimizer: optimizer_file(&self.sft),
            schedule: wsd(),
            training: training_file(&self.sft, seed),
            eval: EvalFile {
                every: Some(self.sft.eval_every),
                batches: Some(4),
            },
            checkpoint: checkpoints(checkpoint_every),
            lora: None,
            distill: None,
        }
    }
}

/// The agent stage's training tasks (SFT traces and GRPO prompts) are drawn with this seed...
pub fn agent_task_seed(seed: u64) -> u64 {
    seed + 11
}

/// ... and its held-out problems with this one.
pub fn agent_held_out_seed(seed: u64) -> u64 {
    seed + 10
}

/// Checkpoints of a training stage: by default one at the end (the speedrun is short enough to
/// rerun, and each checkpoint writes the optimizer state too); with `every > 0`, one every that
/// many steps, all kept (a series for `stoke eval run --checkpoints`).
fn checkpoints(every: u64) -> CheckpointFile {
    CheckpointFile {
        every: Some(every),
        keep: Some(usize::from(every == 0)),
        keep_steps: Vec::new(),
    }
}

impl Recipe {
    /// The GRPO stage's config (`stoke grpo <out>/grpo.toml` reruns it): the SFT model in
    /// `model_dir`, written to `run_dir`.
    pub fn grpo_config(
        &self,
        model_dir: &Path,
        run_dir: &Path,
        seed: u64,
    ) -> anyhow::Result<String> {
        let g = self.grpo;
        let file = self.grpo_file(model_dir, None, run_dir, seed, (g.steps, g.lr));
        Ok(format!(
            "# speedrun ({}) - GRPO on the SFT model\n{}",
            self.name,
            toml::to_string(&file)?
        ))
    }

    /// The distillation stage's on-policy phase (`stoke grpo <out>/distill-on-policy.toml`
    /// reruns it): the GRPO stage's prompts and sampling, the `student` trained with
    /// `[grpo.loss.distill]` against the `teacher`, written to `run_dir`.
    pub fn on_policy_distill_config(
        &self,
        student: &Path,
        teacher: &Path,
        run_dir: &Path,
        seed: u64,
    ) -> anyhow::Result<String> {
        let d = self.distill;
        let mut file = self.grpo_file(
            student,
            Some(teacher),
            run_dir,
            seed,
            (d.on_policy_steps, d.on_policy_lr),
        );
        file.grpo.loss.distill = Some(OpdConfig {
            kl_coef: 1.0,
            reward_weight: 0.0,
        });
        Ok(format!(
            "# speedrun ({}) - on-policy distillation of the GRPO model into the student\n{}",
            self.name,
            toml::to_string(&file)?
        ))
    }

    /// The agent stage's SFT (`stoke train <out>/agent-sft.toml` reruns it): the SFT model in
    /// `paths.model_source` on the tool-use traces, with the SFT stage's data layout.
    pub fn agent_sft_config(&self, paths: &StagePaths, seed: u64) -> ConfigFile {
        let a = &self.agent;
        let mut file = self.sft_config(paths, seed, 0);
        file.title = Some(format!(
            "speedrun ({}) - agent: SFT on calculator tool-use traces",
            self.name
        ));
        file.data.micro_batch_size = a.sft.micro_batch_size;
        file.optimizer = optimizer_file(&a.sft);
        file.training = training_file(&a.sft, seed);
        file.eval.every = Some(a.sft.eval_every);
        file
    }

    /// The agent stage's multi-turn GRPO (`stoke grpo <out>/agent-grpo.toml` reruns it): the
    /// agent-SFT model in `model_dir` in the calculator environment, calculator tasks drawn with
    /// seed `seed + 11`, the held-out ones with `seed + 10`, the exact-match reward on the final
    /// answer; written to `run_dir`.
    pub fn agent_grpo_config(
        &self,
        model_dir: &Path,
        run_dir: &Path,
        seed: u64,
    ) -> anyhow::Result<String> {
        let a = &self.agent;
        let g = a.grpo;
        let mut file = self.grpo_file_of(&g, model_dir, None, run_dir, seed, (g.steps, g.lr));
        let calculator = |problems: usize, seed: u64| TaskSourceFile::Calculator {
            digits: Some(a.digits),
            problems: Some(problems),
            seed: Some(seed),
        };
        file.tasks = Some(calculator(g.problems, agent_task_seed(seed)));
        file.held_out = Some(calculator(a.held_out_problems, agent_held_out_seed(seed)));
        file.grpo.max_new_tokens = Some(a.max_turn_tokens);
        file.eval.samples = Some(1);
        file.environment = Some(EnvironmentSection {
            kind: EnvironmentKind::Calculator,
            tool_call_parser: Some("hermes".to_string()),
            tools_in: Some(ToolsIn::None),
            max_turns: Some(a.max_turns),
            max_turn_tokens: Some(a.max_turn_tokens),
            max_total_tokens: None,
            truncated_turns: None,
            env_timeout_s: None,
            tool_timeout_s: None,
            max_tool_calls_per_turn: None,
            max_tool_output_bytes: None,
            tools: None,
            system_prompt: None,
            requires_tool: None,
            mcp: Vec::new(),
            openenv: None,
        });
        Ok(format!(
            "# speedrun ({}) - agent: multi-turn GRPO with the calculator tool\n{}",
            self.name,
            toml::to_string(&file)?
        ))
    }

    /// The layers of the speedrun model a distillation student keeps: the first half.
    pub fn student_layers(&self) -> Vec<usize> {
        (0..(self.model.layers / 2).max(1)).collect()
    }

    /// The GRPO stage's file (the on-policy distillation phase adds its `[grpo.loss.distill]`).
    fn grpo_file(
        &self,
        model_dir: &Path,
        reference: Option<&Path>,
        run_dir: &Path,
        seed: u64,
        (steps, lr): (u64, f64),
    ) -> GrpoConfigFile {
        self.grpo_file_of(&self.grpo, model_dir, reference, run_dir, seed, (steps, lr))
    }

    /// [`Recipe::grpo_file`] with the sizes `g` (the agent stage has its own).
    fn grpo_file_of(
        &self,
        g: &GrpoSizes,
        model_dir: &Path,
        reference: Option<&Path>,
        run_dir: &Path,
        seed: u64,
        (steps, lr): (u64, f64),
    ) -> GrpoConfigFile {
        let levels: Vec<String> = self.levels.iter().map(|l| l.name().to_string()).collect();
        let arithmetic = |problems: usize, seed: u64| TaskSourceFile::Arithmetic {
            levels: Some(levels.clone()),
            problems: Some(problems),
            seed: Some(seed),
        };
        let reward = RewardConfig::ExactMatch(ExactMatchConfig {
            mode: MatchMode::Gsm8k,
            extract_answer: true,
        });
        GrpoConfigFile {
            output_dir: Some(run_dir.to_path_buf()),
            model: ModelSection {
                path: model_dir.to_path_buf(),
                reference: reference.map(Path::to_path_buf),
            },
            tasks: Some(arithmetic(g.problems, seed + 1)),
            held_out: Some(arithmetic(self.held_out_problems, seed)),
            rewards: BTreeMap::from([("default".to_string(), reward)]),
            grpo: GrpoSection {
                prompts_per_step: Some(g.prompts_per_step),
                group_size: Some(g.group_size),
                max_new_tokens: Some(self.eval_max_new_tokens),
                temperature: Some(shortest_f64(g.temperature)),
                mode: Some(ModeFile::Async),
                max_off_policy_steps: Some(1),
                lag: Some(LagFile::Fixed),
                ..GrpoSection::default()
            },
            training: TrainingSection {
                steps: Some(steps),
                seed: Some(seed),
                ..TrainingSection::default()
            },
            optimizer: OptimizerFile {
                kind: OptimizerKind::Adamw,
                lr: Some(lr),
                beta2: Some(0.999),
                weight_decay: Some(0.0),
                ..OptimizerFile::default()
            },
            schedule: ScheduleFile {
                kind: ScheduleKind::Cosine,
                warmup_steps: Some(0),
                min_lr_ratio: Some(0.0),
                ..ScheduleFile::default()
            },
            eval: EvalSection {
                every: Some(g.eval_every),
                samples: Some(4),
                problems: Some(g.eval_problems.min(self.held_out_problems)),
            },
            checkpoint: CheckpointFile {
                every: Some(0),
                keep: Some(1),
                keep_steps: Vec::new(),
            },
            ptx: None,
            lora: None,
            rollout: None,
            reward: None,
            reference: None,
            environment: None,
        }
    }
}

impl Recipe {
    /// One run of the preference stage (`stoke dpo <out>/dpo-<loss>.toml` reruns it): `loss` on
    /// `pairs`, starting from and referenced to the SFT model in `model_dir`, written to
    /// `run_dir`; the reference log-probs cached in `cache_dir` (shared by the stage's runs).
    pub fn dpo_config(
        &self,
        loss: &str,
        model_dir: &Path,
        pairs: &Path,
        run_dir: &Path,
        cache_dir: &Path,
        seed: u64,
    ) -> anyhow::Result<String> {
        let p = self.preference;
        let loss_type: DpoLossType = toml::Value::String(loss.to_string()).try_into()?;
        let file = PreferenceFile {
            title: None,
            output_dir: run_dir.to_path_buf(),
            model: PreferenceModelFile {
                path: model_dir.to_path_buf(),
                tokenizer: None,
            },
            data: PairDataFile {
                train: pairs.to_path_buf(),
                eval: None,
                max_len: Some(self.seq_len),
                strict: false,
                pairs_per_micro_batch: p.pairs_per_micro_batch,
                micro_batches: 1,
                layout: PairLayout::default(),
            },
            objective: ObjectiveFile {
                kind: ObjectiveKind::Dpo,
            },
            dpo: DpoLoss {
                beta: p.beta,
                loss_type: vec![loss_type],
                ..DpoLoss::default()
            },
            cpo: CpoLoss::default(),
            orpo: OrpoLoss::default(),
            kto: KtoLoss::default(),
            reward_model: Default::default(),
            reference: ReferenceFile {
                mode: ReferenceMode::Cached,
                cache_dir: Some(cache_dir.to_path_buf()),
                sync_steps: None,
                mixup_alpha: None,
            },
            optimizer: OptimizerFile {
                kind: OptimizerKind::Adamw,
                lr: Some(p.lr),
                weight_decay: Some(0.0),
                ..OptimizerFile::default()
            },
            schedule: Some(ScheduleFile {
                kind: ScheduleKind::Cosine,
                warmup_steps: Some(0),
                min_lr_ratio: Some(0.0),
                ..ScheduleFile::default()
            }),
            training: PreferenceTrainingFile {
                seed,
                ..PreferenceTrainingFile::new(p.steps)
            },
            checkpoint: CheckpointFile::default(),
        };
        Ok(format!(
            "# speedrun ({}) - {loss} on the SFT model's own verified samples\n{}",
            self.name,
            file.to_toml()?
        ))
    }
}

/// Where one training stage reads and writes.
#[derive(Clone, Debug)]
pub struct StagePaths {
    pub run_dir: PathBuf,
    /// Pretraining: the model's config.json (random init); SFT: the pretrained model folder.
    pub model_source: PathBuf,
    pub tokenizer: PathBuf,
    /// Pretraining: the train shard folder; SFT: the chat JSONL.
    pub train_data: PathBuf,
    pub eval_data: Option<PathBuf>,
}

fn optimizer_file(stage: &StageSizes) -> OptimizerFile {
    OptimizerFile {
        kind: stage.optimizer,
        lr: stage.lr,
        ..OptimizerFile::default()
    }
}

/// Warmup-stable-decay with the trainer's defaults (5% warmup, last 20% decayed to 0).
fn wsd() -> ScheduleFile {
    ScheduleFile {
        kind: ScheduleKind::Wsd,
        ..ScheduleFile::default()
    }
}

fn training_file(stage: &StageSizes, seed: u64) -> TrainingFile {
    TrainingFile {
        steps: stage.steps,
        seed,
        z_loss: None,
        logit_softcap: None,
        max_bad_steps: None,
        spike: None,
        precision: None,
        activation_checkpointing: None,
        moe: None,
        mtp_loss_weight: None,
    }
}

/// Writes `config` as TOML to `path` (for people: `stoke train <path>` reruns the stage) and
/// resolves it into the validated runtime config.
pub fn write_and_resolve(config: &ConfigFile, path: &Path) -> anyhow::Result<TrainConfig> {
    use anyhow::Context;
    let text = toml::to_string(config).context("serializing a stage config")?;
    std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    TrainConfig::from_file(config.clone(), base)
        .with_context(|| format!("resolving {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoke_pipeline::config::GrpoConfig;
    use stoke_pipeline::settings::{Lag, PipelineMode};

    /// The typed stage configs read back through each command's own parser with the recipe's
    /// values (the GRPO and on-policy distillation files through `stoke grpo`'s, the DPO file
    /// through `stoke dpo`'s).
    #[test]
    fn stage_configs_read_back_with_the_recipes_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (model, run) = (dir.path().join("model"), dir.path().join("run"));
        for recipe in [Recipe::quick(), Recipe::full()] {
            let g = recipe.grpo;
            let origin = dir.path().join("grpo.toml");
            let text = recipe.grpo_config(&model, &run, 7).expect("grpo config");
            let grpo = GrpoConfig::parse(&text, &origin, &[]).expect("grpo config parses");
            let s = &grpo.settings;
            assert_eq!(grpo.model, model);
            assert_eq!(grpo.out_dir, run);
            assert_eq!((s.steps, s.seed), (g.steps, 7));
            assert_eq!(
                (s.prompts_per_step, s.group_size),
                (g.prompts_per_step, g.group_size)
            );
            assert_eq!(s.temperature.start, g.temperature);
            assert_eq!((s.mode, s.lag), (PipelineMode::Async, Lag::Fixed));
            assert_eq!(stoke_train::config::peak_lr(&s.optimizer), g.lr);
            assert!(s.loss.distill.is_none());
            assert_eq!(grpo.rewards.len(), 1);

            let text = recipe
                .on_policy_distill_config(&model, &dir.path().join("teacher"), &run, 7)
                .expect("on-policy config");
            let opd = GrpoConfig::parse(&text, &origin, &[]).expect("on-policy config parses");
            assert_eq!(opd.reference_model, Some(dir.path().join("teacher")));
            assert_eq!(opd.settings.steps, recipe.distill.on_policy_steps);
            let distill = opd.settings.loss.distill.expect("the distillation term");
            assert_eq!((distill.kl_coef, distill.reward_weight), (1.0, 0.0));

            let a = recipe.agent;
            let text = recipe
                .agent_grpo_config(&model, &run, 7)
                .expect("agent grpo config");
            let agent = GrpoConfig::parse(&text, &origin, &[]).expect("agent config parses");
            let environment = agent.settings.environment.expect("an [environment]");
            assert_eq!(environment.kind, EnvironmentKind::Calculator);
            assert_eq!(environment.tools_in, ToolsIn::None);
            assert_eq!(
                (
                    environment.limits.max_turns,
                    environment.limits.max_turn_tokens
                ),
                (a.max_turns, a.max_turn_tokens)
            );
            assert_eq!(agent.settings.steps, a.grpo.steps);
            assert_eq!(
                agent.held_out,
                Some(stoke_pipeline::config::TaskSource::Calculator {
                    digits: a.digits,
                    problems: a.held_out_problems,
                    seed: agent_held_out_seed(7),
                })
            );
            assert_ne!(agent_held_out_seed(7), agent_task_seed(7));

            let p = recipe.preference;
            let path = dir.path().join("dpo-sigmoid.toml");
            let text = recipe
                .dpo_config(
                    "sigmoid",
                    &model,
                    &dir.path().join("pairs.jsonl"),
                    &run,
                    dir.path(),
                    7,
                )
                .expect("dpo config");
            std::fs::write(&path, text).expect("write");
            let dpo = PreferenceFile::load(&path, &[]).expect("dpo config parses");
            assert_eq!(
                (dpo.model.path.clone(), dpo.output_dir.clone()),
                (model.clone(), run.clone())
            );
            assert_eq!(dpo.dpo.beta, p.beta);
            assert_eq!(dpo.dpo.loss_type, vec![DpoLossType::Sigmoid]);
            assert_eq!(dpo.reference.cache_dir.as_deref(), Some(dir.path()));
            assert_eq!((dpo.training.steps, dpo.training.seed), (p.steps, 7));
            assert_eq!(dpo.data.pairs_per_micro_batch, p.pairs_per_micro_batch);
            assert!(
                recipe
                    .dpo_config("no_such_loss", &model, &path, &run, dir.path(), 7)
                    .is_err()
            );
        }
    }
}
