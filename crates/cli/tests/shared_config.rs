//! One config vocabulary: the tables every training command shares (`[model] path`,
//! `output_dir`, `[training] steps / seed / precision / activation_checkpointing /
//! max_bad_steps`, `[optimizer]`, `[schedule]`, `[checkpoint]`) are read by `stoke train`,
//! `stoke dpo` and `stoke grpo` with the same meaning: for every shared key, one value written
//! once resolves to the same run setting in all three. The old names (`[model] pretrained`,
//! `[out] dir`, `grpo.steps`, ...) still load, as their new names.
//!
//! Each command also needs its own data table (`stoke train` chat data, `stoke dpo` pairs;
//! `stoke grpo` defaults to the built-in arithmetic task); those are not shared and are added per
//! command.

use std::path::{Path, PathBuf};

use stoke_optim::{LrSchedule, OptimizerConfig};
use stoke_pipeline::config::GrpoConfig;
use stoke_train::config::TrainConfig;
use stoke_train::preference::run::PreferenceFile;
use stoke_types::Precision;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

/// The settings the shared tables set, as each command resolved them.
#[derive(Debug, PartialEq)]
struct Shared {
    model: PathBuf,
    output_dir: PathBuf,
    steps: u64,
    seed: u64,
    precision: Precision,
    activation_checkpointing: bool,
    max_bad_steps: u64,
    optimizer: OptimizerConfig,
    clip_grad_norm: Option<f64>,
    /// The schedule's factor at every step of the run.
    lr_factors: Vec<u64>,
    checkpoint_every: u64,
    checkpoint_keep: usize,
    keep_steps: Vec<u64>,
}

fn factors(schedule: &LrSchedule, steps: u64) -> Vec<u64> {
    (0..steps)
        .map(|s| schedule.lr_factor(s).to_bits())
        .collect()
}

fn hidden_size() -> usize {
    stoke_model::ModelConfig::from_file(&fixture().join("config.json"))
        .unwrap()
        .hidden_size
}

/// Writes `shared` plus the command's own data table to `dir/<command>.toml`.
fn write(dir: &Path, command: &str, shared: &str) -> PathBuf {
    let own = match command {
        "train" => {
            "[data]\nkind = \"chat\"\ntrain = [\"chat.jsonl\"]\nseq_len = 64\nmicro_batch_size = 2\n"
        }
        "dpo" => "[data]\ntrain = \"pairs.jsonl\"\n",
        _ => "",
    };
    for data in ["chat.jsonl", "pairs.jsonl"] {
        std::fs::write(dir.join(data), "").unwrap();
    }
    let path = dir.join(format!("{command}.toml"));
    std::fs::write(&path, format!("{shared}\n{own}")).unwrap();
    path
}

fn train(dir: &Path, shared: &str, sets: &[String]) -> Shared {
    let c = TrainConfig::load(&write(dir, "train", shared), sets).unwrap();
    let stoke_train::config::ModelSource::Pretrained(model) = &c.model.source else {
        panic!("[model] path is a pretrained folder: {:?}", c.model.source)
    };
    Shared {
        model: model.clone(),
        output_dir: c.output_dir.clone(),
        steps: c.training.steps,
        seed: c.training.seed,
        precision: c.training.precision,
        activation_checkpointing: c.training.activation_checkpointing,
        max_bad_steps: c.training.max_bad_steps,
        optimizer: c.optimizer.clone(),
        clip_grad_norm: c.training.clip_norm,
        lr_factors: factors(&c.schedule, c.training.steps),
        checkpoint_every: c.training.checkpoint_every,
        checkpoint_keep: c.training.keep_last,
        keep_steps: c.training.keep_steps.clone(),
    }
}

fn dpo(dir: &Path, shared: &str, sets: &[String]) -> Shared {
    let f = PreferenceFile::load(&write(dir, "dpo", shared), sets).unwrap();
    Shared {
        model: f.model.path.clone(),
        output_dir: f.output_dir.clone(),
        steps: f.training.steps,
        seed: f.training.seed,
        precision: f.training.precision,
        activation_checkpointing: f.training.activation_checkpointing,
        max_bad_steps: f.training.max_bad_steps,
        optimizer: f.resolved_optimizer(hidden_size()).unwrap(),
        clip_grad_norm: stoke_train::config::keys::clip_grad_norm(f.optimizer.clip_grad_norm),
        lr_factors: factors(&f.resolved_schedule().unwrap(), f.training.steps),
        checkpoint_every: f.checkpoint.every.unwrap_or(0),
        checkpoint_keep: f
            .checkpoint
            .keep
            .unwrap_or(stoke_train::preference::run::DEFAULT_KEEP),
        keep_steps: f.checkpoint.keep_steps.clone(),
    }
}

fn grpo(dir: &Path, shared: &str, sets: &[String]) -> Shared {
    let c = GrpoConfig::load(&write(dir, "grpo", shared), sets).unwrap();
    let s = &c.settings;
    Shared {
        model: c.model.clone(),
        output_dir: c.out_dir.clone(),
        steps: s.steps,
        seed: s.seed,
        precision: s.precision,
        activation_checkpointing: s.activation_checkpointing,
        max_bad_steps: s.max_bad_steps,
        optimizer: s.optimizer.clone(),
        clip_grad_norm: s.clip_grad_norm,
        lr_factors: factors(&s.schedule, s.steps),
        checkpoint_every: s.checkpoint_every,
        checkpoint_keep: s.keep_checkpoints,
        keep_steps: s.keep_steps.clone(),
    }
}

/// Every shared key written: the three commands resolve the same settings.
const ALL_SHARED: &str = r#"
output_dir = "runs/shared"
[model]
path = "MODEL"
[training]
steps = 24
seed = 11
precision = "bf16"
activation_checkpointing = true
max_bad_steps = 5
[optimizer]
kind = "adamw"
lr = 2e-4
beta1 = 0.8
beta2 = 0.95
eps = 1e-7
weight_decay = 0.05
clip_grad_norm = 0.5
[schedule]
kind = "wsd"
warmup_steps = 3
min_lr_ratio = 0.1
[checkpoint]
every = 4
keep = 3
keep_steps = [8]
"#;

fn all_shared() -> String {
    ALL_SHARED.replace("MODEL", &fixture().display().to_string())
}

#[test]
fn a_config_of_the_shared_tables_means_the_same_to_train_dpo_and_grpo() {
    let dir = tempfile::tempdir().unwrap();
    let shared = all_shared();
    let t = train(dir.path(), &shared, &[]);
    let d = dpo(dir.path(), &shared, &[]);
    let g = grpo(dir.path(), &shared, &[]);
    assert_eq!(
        t, d,
        "stoke train and stoke dpo read the shared tables differently"
    );
    assert_eq!(
        t, g,
        "stoke train and stoke grpo read the shared tables differently"
    );
    assert_eq!(t.output_dir, dir.path().join("runs/shared"));
    assert_eq!(t.precision, Precision::Bf16);
    assert_eq!(t.keep_steps, [8]);
}

#[test]
fn every_shared_key_set_alone_moves_all_three_commands_alike() {
    // Each shared key, overridden on top of the full config: all three commands must follow it,
    // and it must change what they resolve (a key that no command reads would pass the first
    // test vacuously).
    let dir = tempfile::tempdir().unwrap();
    let shared = all_shared();
    let base = train(dir.path(), &shared, &[]);
    let other_model = dir.path().join("other-model");
    std::fs::create_dir_all(&other_model).unwrap();
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        let from = fixture().join(file);
        if from.exists() {
            std::fs::copy(&from, other_model.join(file)).unwrap();
        }
    }
    let sets = [
        format!("model.path=\"{}\"", other_model.display()),
        "output_dir=\"runs/elsewhere\"".to_string(),
        "training.steps=30".into(),
        "training.seed=12".into(),
        "training.precision=\"f32\"".into(),
        "training.activation_checkpointing=false".into(),
        "training.max_bad_steps=2".into(),
        "optimizer.lr=1e-3".into(),
        "optimizer.beta1=0.7".into(),
        "optimizer.beta2=0.9".into(),
        "optimizer.eps=1e-6".into(),
        "optimizer.weight_decay=0.2".into(),
        "optimizer.clip_grad_norm=0".into(),
        "schedule.kind=\"cosine\"".into(),
        "schedule.warmup_steps=5".into(),
        "schedule.decay_fraction=0.5".into(),
        "schedule.min_lr_ratio=0.3".into(),
        "checkpoint.every=6".into(),
        "checkpoint.keep=1".into(),
        "checkpoint.keep_steps=[2, 10]".into(),
    ];
    for set in sets {
        let one = [set.clone()];
        let t = train(dir.path(), &shared, &one);
        assert_ne!(t, base, "--set {set} changed nothing in stoke train");
        assert_eq!(
            t,
            dpo(dir.path(), &shared, &one),
            "--set {set}: train vs dpo"
        );
        assert_eq!(
            t,
            grpo(dir.path(), &shared, &one),
            "--set {set}: train vs grpo"
        );
    }
}

#[test]
fn old_names_of_shared_keys_load_as_their_new_names() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture().display().to_string();
    let new = all_shared();
    // `stoke train` and `stoke dpo`: `[model] pretrained`.
    let old_model = new.replace("[model]\npath", "[model]\npretrained");
    assert_eq!(
        train(dir.path(), &old_model, &[]),
        train(dir.path(), &new, &[])
    );
    assert_eq!(dpo(dir.path(), &old_model, &[]), dpo(dir.path(), &new, &[]));
    // `stoke grpo`: `[out] dir` and the `[grpo]` names of the training keys.
    let old_grpo = format!(
        "[model]\npath = \"{model}\"\n[out]\ndir = \"runs/shared\"\n[grpo]\nsteps = 24\nseed = 11\n\
         precision = \"bf16\"\nactivation_checkpointing = true\nmax_bad_steps = 5\n{}",
        &new[new.find("[optimizer]").unwrap()..]
    );
    assert_eq!(
        grpo(dir.path(), &old_grpo, &[]),
        grpo(dir.path(), &new, &[])
    );
}

#[test]
fn the_shared_defaults_are_the_same_in_every_command() {
    // Only what must be said: the model, the run's length, and the two defaults that depend on
    // the objective (the learning rate and weight decay; see the configuration chapter). Every
    // other shared key, the whole `[schedule]` and `[checkpoint]` included, takes one default.
    let dir = tempfile::tempdir().unwrap();
    let minimal = format!(
        "output_dir = \"runs/defaults\"\n[model]\npath = \"{}\"\n[training]\nsteps = 40\n\
         [optimizer]\nlr = 1e-4\nweight_decay = 0.0\n",
        fixture().display()
    );
    let t = train(dir.path(), &minimal, &[]);
    assert_eq!(t, dpo(dir.path(), &minimal, &[]), "train vs dpo defaults");
    assert_eq!(t, grpo(dir.path(), &minimal, &[]), "train vs grpo defaults");
    // The one default schedule: WSD, a warmup of steps / 20, the last 20% decaying.
    let factor = |step: usize| f64::from_bits(t.lr_factors[step]);
    assert!(factor(0) < factor(2), "no warmup: {:?}", &t.lr_factors[..3]);
    assert_eq!(factor(10), 1.0);
    assert!(factor(39) < 0.2, "no decay at the end");
}
