//! The run config: unknown keys named, `--set` overrides, derived defaults, the resolved file
//! round trip, and which differences a resume refuses.

use std::path::Path;

use stoke_optim::{LrSchedule, OptimizerConfig};
use stoke_train::config::{
    ConfigError, ConfigFile, TrainConfig, apply_overrides, default_lr, math_fields_differ,
};

const BASE: &str = r#"
output_dir = "run"
[model]
preset = "nano"
vocab_size = 300
[data]
kind = "shards"
train = ["shards"]
seq_len = 64
micro_batch_size = 4
[training]
steps = 100
"#;

fn resolve(text: &str, sets: &[&str]) -> Result<TrainConfig, ConfigError> {
    let mut table: toml::Table = toml::from_str(text).unwrap();
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    apply_overrides(&mut table, &sets)?;
    let file = ConfigFile::from_table(table, "test.toml")?;
    TrainConfig::from_file(file, Path::new("/base"))
}

#[test]
fn an_unknown_key_is_named_with_its_path() {
    let text = BASE.replace("steps = 100", "steps = 100\nclip_nrom = 1.0");
    let error = resolve(&text, &[]).unwrap_err().to_string();
    assert!(error.contains("training"), "{error}");
    assert!(error.contains("clip_nrom"), "{error}");
}

#[test]
fn overrides_parse_toml_values_and_create_tables() {
    let config = resolve(
        BASE,
        &[
            "training.steps=7",
            "optimizer.lr=1e-3",
            "training.spike.action=both",
            "data.packing={ kind = \"concat_chunk\" }",
        ],
    )
    .unwrap();
    assert_eq!(config.training.steps, 7);
    assert_eq!(config.peak_lr(), 1e-3);
    assert_eq!(
        config.training.spike.action,
        stoke_train::spike::SpikeAction::Both
    );
    assert_eq!(
        config.data.packing,
        stoke_data::packing::PackingPolicy::ConcatChunk
    );
}

#[test]
fn an_override_of_an_unknown_key_or_through_a_value_fails_naming_it() {
    let error = resolve(BASE, &["training.stepz=3"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("stepz"), "{error}");
    let error = resolve(BASE, &["training.steps.x=3"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("training.steps"), "{error}");
    let error = resolve(BASE, &["no_equals_sign"]).unwrap_err().to_string();
    assert!(error.contains("key=value"), "{error}");
}

#[test]
fn defaults_are_derived_from_the_model_and_the_run_length() {
    assert!((default_lr(768) - 6e-4).abs() < 1e-12);
    assert!((default_lr(2048) - 2.25e-4).abs() < 1e-12);
    assert_eq!(default_lr(64), 3e-3, "small widths are capped");
    let config = resolve(BASE, &[]).unwrap();
    let OptimizerConfig::AdamW(adamw) = &config.optimizer else {
        panic!("adamw by default")
    };
    assert_eq!(adamw.lr, default_lr(64));
    assert_eq!(
        (adamw.beta1, adamw.beta2, adamw.weight_decay),
        (0.9, 0.95, 0.1)
    );
    assert_eq!(config.training.clip_norm, Some(1.0));
    match config.schedule {
        LrSchedule::Wsd {
            warmup_steps,
            decay_start,
            decay_steps,
            ..
        } => {
            assert_eq!((warmup_steps, decay_start, decay_steps), (5, 80, 20));
        }
        other => panic!("WSD by default, got {other:?}"),
    }
    assert_eq!(
        config.data.source,
        stoke_train::config::DataSource::Shards {
            train: vec!["/base/shards".into()],
            eval: vec![],
        }
    );
}

#[test]
fn tokens_per_step_sets_the_accumulation_and_must_divide() {
    let config = resolve(BASE, &["data.tokens_per_step=1024"]).unwrap();
    assert_eq!(config.data.grad_accum_steps, 4);
    let error = resolve(BASE, &["data.tokens_per_step=1000"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("data.tokens_per_step"), "{error}");
}

#[test]
fn the_resolved_config_round_trips_through_toml() {
    for sets in [
        vec![],
        vec![
            "optimizer.kind=muon",
            "schedule.kind=cosine",
            "training.logit_softcap=30.0",
        ],
        vec![
            "schedule.kind=constant",
            "schedule.batch_warmup={ start_tokens_per_step = 256, ramp_tokens = 10000 }",
        ],
    ] {
        let config = resolve(BASE, &sets).unwrap();
        let text = config.to_toml().unwrap();
        let back = TrainConfig::from_toml(&text, "saved.toml").unwrap();
        assert_eq!(back, config, "{text}");
    }
}

#[test]
fn resume_refuses_math_changes_and_allows_the_rest() {
    let saved = resolve(BASE, &["schedule.warmup_steps=5"]).unwrap();
    let longer = resolve(
        BASE,
        &[
            "schedule.warmup_steps=5",
            "training.steps=200",
            "eval.every=5",
        ],
    )
    .unwrap();
    // A longer run moves the WSD decay, but not before step 50.
    assert!(math_fields_differ(&saved, &longer, 50).is_empty());
    let diffs = math_fields_differ(&saved, &longer, 90);
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert_eq!(diffs[0].0, "schedule");
    let other_lr = resolve(BASE, &["schedule.warmup_steps=5", "optimizer.lr=0.01"]).unwrap();
    let diffs = math_fields_differ(&saved, &other_lr, 10);
    assert_eq!(
        diffs.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(),
        vec!["optimizer.lr"]
    );
    let other_batch = resolve(
        BASE,
        &["schedule.warmup_steps=5", "data.micro_batch_size=8"],
    )
    .unwrap();
    assert_eq!(
        math_fields_differ(&saved, &other_batch, 10)[0].0,
        "data.micro_batch_size"
    );
}

#[test]
fn invalid_combinations_are_refused_with_the_key() {
    let error = resolve(BASE, &["model.config=\"c.json\""])
        .unwrap_err()
        .to_string();
    assert!(error.contains("exactly one"), "{error}");
    let error = resolve(BASE, &["optimizer.momentum=0.9"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("optimizer.momentum"), "{error}");
    let error = resolve(BASE, &["training.z_loss=-1.0"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("training.z_loss"), "{error}");
    let error = resolve(BASE, &["training.mtp_loss_weight=-0.1"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("training.mtp_loss_weight"), "{error}");
    let ok = resolve(BASE, &["training.mtp_loss_weight=0.3"]).unwrap();
    assert_eq!(ok.training.mtp_loss_weight, Some(0.3));
}

#[test]
fn the_example_configs_parse() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let pretrain = TrainConfig::load(&root.join("pretrain-tiny.toml"), &[]).unwrap();
    assert_eq!(pretrain.training.steps, 500);
    // The SFT example names a pretrained folder made by the pretraining example, so only the
    // file layer is checked here.
    let text = std::fs::read_to_string(root.join("sft-tiny.toml")).unwrap();
    ConfigFile::from_table(toml::from_str(&text).unwrap(), "sft-tiny.toml").unwrap();
}

#[test]
fn batch_size_warmup_ramps_the_micro_batches_per_step() {
    // 4 x 64 = 256 tokens per micro-batch, 8 micro-batches = 2048 tokens per full step.
    let config = resolve(
        BASE,
        &[
            "data.grad_accum_steps=8",
            "schedule.batch_warmup={ start_tokens_per_step = 256, ramp_tokens = 10000 }",
        ],
    )
    .unwrap();
    assert_eq!(config.grad_accum_at(0), 1);
    assert_eq!(
        config.grad_accum_at(5000),
        5,
        "1152 tokens wanted -> 5 micro-batches"
    );
    assert_eq!(config.grad_accum_at(10_000), 8);
    assert_eq!(config.grad_accum_at(1_000_000), 8);
    let error = resolve(
        BASE,
        &["schedule.batch_warmup={ start_tokens_per_step = 4096, ramp_tokens = 10 }"],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("start_tokens_per_step"), "{error}");
}

#[test]
fn precision_defaults_to_f32_parses_bf16_and_names_a_bad_value() {
    use stoke_types::Precision;
    assert_eq!(
        resolve(BASE, &[]).unwrap().training.precision,
        Precision::F32
    );
    let bf16 = resolve(BASE, &["training.precision=\"bf16\""]).unwrap();
    assert_eq!(bf16.training.precision, Precision::Bf16);
    // The resolved file keeps it, and an f32 run's file does not grow a new key.
    let text = toml::to_string(&bf16.to_file()).unwrap();
    assert!(text.contains("precision = \"bf16\""), "{text}");
    let f32_text = toml::to_string(&resolve(BASE, &[]).unwrap().to_file()).unwrap();
    assert!(!f32_text.contains("precision"), "{f32_text}");
    // Changing precision is a change of the math: a resume refuses it.
    let f32_run = resolve(BASE, &[]).unwrap();
    let diffs = math_fields_differ(&f32_run, &bf16, 10);
    assert!(
        diffs
            .iter()
            .any(|(field, _, _)| field == "training.precision"),
        "{diffs:?}"
    );
    let error = resolve(BASE, &["training.precision=\"fp8\""])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("precision") && error.contains("fp8"),
        "{error}"
    );
}

#[test]
fn activation_checkpointing_is_off_by_default_and_free_to_change_on_resume() {
    let off = resolve(BASE, &[]).unwrap();
    assert!(!off.training.activation_checkpointing);
    let on = resolve(BASE, &["training.activation_checkpointing=true"]).unwrap();
    assert!(on.training.activation_checkpointing);
    let text = toml::to_string(&on.to_file()).unwrap();
    assert!(text.contains("activation_checkpointing = true"), "{text}");
    // Exact (bit-identical gradients), so a resume accepts the change.
    assert!(math_fields_differ(&off, &on, 10).is_empty());
    let error = resolve(BASE, &["training.activation_checkpointing=1"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("activation_checkpointing"), "{error}");
}

#[test]
fn int8_moments_parse_round_trip_and_count_as_math_on_resume() {
    use stoke_optim::{MomentFormat, OptimizerConfig};
    let moments = |c: &stoke_train::config::TrainConfig| match &c.optimizer {
        OptimizerConfig::AdamW(a) => a.moments,
        OptimizerConfig::Muon(m) => m.adamw.moments,
    };
    let f32_run = resolve(BASE, &[]).unwrap();
    assert_eq!(moments(&f32_run), MomentFormat::F32);
    let int8 = resolve(BASE, &["optimizer.moments=\"int8\""]).unwrap();
    assert_eq!(moments(&int8), MomentFormat::Int8);
    let text = toml::to_string(&int8.to_file()).unwrap();
    assert!(text.contains("moments = \"int8\""), "{text}");
    assert!(
        math_fields_differ(&f32_run, &int8, 10)
            .iter()
            .any(|(field, _, _)| field == "optimizer.moments")
    );
    let error = resolve(BASE, &["optimizer.moments=\"int4\""])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("moments") && error.contains("int4"),
        "{error}"
    );
}

#[test]
fn old_key_names_are_read_under_the_shared_vocabulary_and_both_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let old_text = BASE.replace(
        "steps = 100",
        "steps = 100\nclip_norm = 0.5\neval_every = 7\neval_batches = 3\ncheckpoint_every = 9\nkeep_last = 4\nkeep_steps = [18]",
    );
    let new_text = format!(
        "{BASE}[optimizer]\nclip_grad_norm = 0.5\n[eval]\nevery = 7\nbatches = 3\n\
         [checkpoint]\nevery = 9\nkeep = 4\nkeep_steps = [18]\n"
    );
    let old_path = dir.path().join("old.toml");
    let new_path = dir.path().join("new.toml");
    std::fs::write(&old_path, &old_text).unwrap();
    std::fs::write(&new_path, &new_text).unwrap();
    let old = TrainConfig::load(&old_path, &[]).unwrap();
    let new = TrainConfig::load(&new_path, &[]).unwrap();
    assert_eq!(old, new);
    assert_eq!(new.training.clip_norm, Some(0.5));
    assert_eq!(new.training.eval_every, 7);
    assert_eq!(new.training.eval_batches, 3);
    assert_eq!(new.training.checkpoint_every, 9);
    assert_eq!(new.training.keep_last, 4);
    assert_eq!(new.training.keep_steps, vec![18]);
    // An override under the old name replaces the file's value under the new one.
    let set = TrainConfig::load(&new_path, &["training.clip_norm=0".to_string()]).unwrap();
    assert_eq!(set.training.clip_norm, None);
    // The saved form uses the new names only.
    let saved = new.to_toml().unwrap();
    for old_name in ["clip_norm", "eval_every", "keep_last", "checkpoint_every"] {
        assert!(!saved.contains(old_name), "{old_name} in {saved}");
    }
    let both = format!("{old_text}[optimizer]\nclip_grad_norm = 1.0\n");
    let both_path = dir.path().join("both.toml");
    std::fs::write(&both_path, both).unwrap();
    let error = TrainConfig::load(&both_path, &[]).unwrap_err().to_string();
    assert!(error.contains("training.clip_norm"), "{error}");
    assert!(error.contains("optimizer.clip_grad_norm"), "{error}");
}

#[test]
fn the_init_scheme_is_read_checked_and_round_trips() {
    use stoke_model::InitScheme;
    assert_eq!(
        resolve(BASE, &[]).unwrap().model.init,
        InitScheme::Normal { std: 0.02 },
        "transformers' default"
    );
    let truncated = resolve(
        BASE,
        &["model.init=\"truncated_normal\"", "model.init_std=0.01"],
    )
    .unwrap();
    assert_eq!(
        truncated.model.init,
        InitScheme::TruncatedNormal { std: 0.01 }
    );
    let scaled = resolve(BASE, &["model.init=\"scaled\""]).unwrap();
    assert_eq!(scaled.model.init, InitScheme::Scaled);
    // The resolved file keeps the scheme.
    for config in [truncated, scaled] {
        let text = toml::to_string(&config.to_file()).unwrap();
        assert_eq!(
            resolve(&text, &[]).unwrap().model.init,
            config.model.init,
            "{text}"
        );
    }
    for (sets, key) in [
        (vec!["model.init_std=-1.0"], "model.init_std"),
        (
            vec!["model.init=\"scaled\"", "model.init_std=0.02"],
            "model.init_std",
        ),
        (vec!["model.init=\"xavier\""], "init"),
    ] {
        let error = resolve(BASE, &sets).unwrap_err().to_string();
        assert!(error.contains(key), "{sets:?}: {error}");
    }
}
