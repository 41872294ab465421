//! The GRPO config file: defaults, round trip through `to_toml`, `--set`, and errors that name
//! the offending key.

use std::path::{Path, PathBuf};

use stoke_optim::{LrSchedule, OptimizerConfig};
use stoke_pipeline::config::{GrpoConfig, TaskSource};
use stoke_pipeline::{PipelineError, PipelineMode, WeightSync};
use stoke_reward::RewardConfig;
use stoke_reward::exact_match::MatchMode;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Boxed error: `PipelineError` is large and this helper's results are only inspected.
fn load(text: &str, sets: &[&str]) -> Result<GrpoConfig, Box<PipelineError>> {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "run.toml", text);
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    GrpoConfig::load(&path, &sets).map_err(Box::new)
}

/// The key an error names, or the test fails.
fn field_of(result: Result<GrpoConfig, Box<PipelineError>>) -> (String, String) {
    match result.map_err(|e| *e) {
        Err(PipelineError::Config { field, reason }) => (field, reason),
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("expected an error, the config loaded"),
    }
}

const MINIMAL: &str = "[model]\npath = \"model\"\n";

#[test]
fn minimal_config_gets_documented_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "tiny.toml", MINIMAL);
    let config = GrpoConfig::load(&path, &[]).unwrap();
    let base = std::path::absolute(dir.path()).unwrap();
    assert_eq!(config.model, base.join("model"));
    assert_eq!(config.out_dir, base.join("runs").join("tiny"));
    assert_eq!(config.reference_model, None);
    let s = &config.settings;
    assert_eq!(s.group_size, 16);
    assert_eq!(s.prompts_per_step, 8);
    assert_eq!(s.mode, PipelineMode::Async);
    assert_eq!(s.max_off_policy_steps, 1);
    assert_eq!(s.weight_sync, WeightSync::BetweenBatches);
    assert_eq!(s.temperature.at(0), 1.0);
    assert_eq!(s.top_p, 1.0);
    assert_eq!(s.max_new_tokens, 256);
    assert_eq!(s.clip_grad_norm, Some(1.0));
    assert_eq!(s.loss.kl, None);
    assert_eq!(s.buffer_bytes, 16 << 20);
    assert_eq!(s.reward_timeout.as_secs_f64(), 30.0);
    assert_eq!(s.eval.every, 0);
    assert_eq!(s.eval.samples, 8);
    // The schedule defaults of every training command (an absent table: WSD).
    let shared = stoke_train::config::resolve_lr_schedule(
        &stoke_train::config::ScheduleFile::default(),
        s.steps,
        stoke_train::config::ScheduleDefaults::shared(s.steps),
    )
    .unwrap();
    assert_eq!(s.schedule, shared);
    assert!(
        matches!(s.schedule, LrSchedule::Wsd { .. }),
        "{:?}",
        s.schedule
    );
    match &s.optimizer {
        OptimizerConfig::AdamW(adamw) => {
            assert_eq!(adamw.lr, 1e-6);
            assert_eq!(adamw.weight_decay, 0.0);
        }
        other => panic!("expected AdamW, got {other:?}"),
    }
    assert_eq!(config.rewards.len(), 1);
    assert_eq!(config.rewards[0].0, "default");
    match &config.rewards[0].1 {
        RewardConfig::ExactMatch(c) => {
            assert_eq!(c.mode, MatchMode::Gsm8k);
            assert!(c.extract_answer);
        }
        other => panic!("expected exact_match, got {other:?}"),
    }
    // Arithmetic tasks by default, with the held-out split for evaluation.
    assert!(matches!(config.tasks, TaskSource::Arithmetic { .. }));
    assert!(matches!(
        config.held_out,
        Some(TaskSource::Arithmetic { problems: 64, .. })
    ));
}

#[test]
fn sync_mode_defaults_to_on_policy() {
    let config = load(&format!("{MINIMAL}[grpo]\nmode = \"sync\"\n"), &[]).unwrap();
    assert_eq!(config.settings.mode, PipelineMode::Sync);
    assert_eq!(config.settings.max_off_policy_steps, 0);
}

const FULL: &str = r#"
[model]
path = "policy"
reference = "ref"

[tasks]
kind = "jsonl"
path = "data/tasks.jsonl"

[held_out]
kind = "arithmetic"
levels = ["one_step", "two_step"]
problems = 20
seed = 9

[rewards.default]
kind = "math"

[rewards.format]
kind = "format_regex"
pattern = "^<think>"

[rewards.exact]
kind = "exact_match"
mode = "integer"

[grpo]
steps = 12
prompts_per_step = 4
group_size = 6
max_new_tokens = 48
temperature = 0.7
temperature_end = 0.5
temperature_decay_steps = 10
top_p = 0.9
top_k = 20
seed = 3
mode = "async"
max_off_policy_steps = 2
weight_sync = "in_flight"
rollout_batch_groups = 3
buffer_bytes = 1000000
kl_placement = "reward"
reference_reset_every = 5
old_logprobs = "recompute"
drop_equal_reward_groups = true
micro_batch_tokens = 1024
max_bad_steps = 4
reward_workers = 3
reward_timeout_s = 2.5
threads = 2

[grpo.loss]
beta = 0.04
kl_estimator = "k1"
aggregation = { kind = "sequence_mean_token_mean" }

[optimizer]
kind = "adamw"
lr = 3e-5
weight_decay = 0.01
clip_grad_norm = 0.5

[schedule]
kind = "cosine"
warmup_steps = 2

[eval]
every = 4
samples = 3
problems = 10

[checkpoint]
every = 6
keep = 3
keep_steps = [12]

[ptx]
shards = "shards"
coef = 0.2

[out]
dir = "out"
"#;

#[test]
fn full_config_round_trips_through_to_toml() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "full.toml", FULL);
    let config = GrpoConfig::load(&path, &[]).unwrap();
    let text = config.to_toml().unwrap();
    // The saved config lives elsewhere; its paths are absolute, so it resolves the same.
    let other = tempfile::tempdir().unwrap();
    let saved = write(other.path(), "config.toml", &text);
    let reloaded = GrpoConfig::load(&saved, &[]).unwrap();
    assert_eq!(reloaded, config, "saved config:\n{text}");
    // Spot checks that the file's values arrived (an equal pair of defaults would also pass).
    let s = &config.settings;
    assert_eq!(s.group_size, 6);
    assert_eq!(s.top_k, Some(20));
    assert_eq!(s.weight_sync, WeightSync::InFlight);
    assert_eq!(s.loss.kl.map(|k| k.beta), Some(0.04));
    assert_eq!(s.reward_timeout.as_millis(), 2500);
    assert_eq!((s.checkpoint_every, s.keep_checkpoints), (6, 3));
    assert_eq!(s.keep_steps, [12]);
    assert!((s.temperature.at(5) - 0.6).abs() < 1e-6);
    assert!(text.contains("temperature = 0.7\n"), "{text}");
    assert_eq!(
        config.out_dir,
        std::path::absolute(dir.path()).unwrap().join("out")
    );
}

#[test]
fn defaults_round_trip_too() {
    let config = load(MINIMAL, &[]).unwrap();
    let text = config.to_toml().unwrap();
    let other = tempfile::tempdir().unwrap();
    let saved = write(other.path(), "config.toml", &text);
    assert_eq!(GrpoConfig::load(&saved, &[]).unwrap(), config);
}

#[test]
fn rewards_are_ordered_default_first_then_by_name() {
    let config = load(FULL, &[]).unwrap();
    assert_eq!(config.reward_names(), ["default", "exact", "format"]);
}

#[test]
fn unknown_key_is_named_by_its_path() {
    let (field, reason) = field_of(load(&format!("{MINIMAL}[grpo]\ngroup_sise = 4\n"), &[]));
    assert_eq!(field, "grpo.group_sise");
    assert!(reason.contains("unknown field"), "{reason}");
    let (field, _) = field_of(load(&format!("{MINIMAL}[grpoo]\nsteps = 4\n"), &[]));
    assert_eq!(field, "grpoo");
}

#[test]
fn missing_model_is_named() {
    let (field, reason) = field_of(load("[grpo]\nsteps = 3\n", &[]));
    assert!(
        reason.contains("model"),
        "field {field:?}, reason {reason:?}"
    );
}

#[test]
fn bad_values_name_the_field() {
    let cases: [(&str, &str); 9] = [
        ("[grpo]\ngroup_size = 0\n", "grpo.group_size"),
        ("[grpo]\ntop_p = 1.5\n", "grpo.top_p"),
        ("[grpo]\ntemperature = 0.0\n", "grpo.temperature"),
        (
            "[grpo]\nmode = \"sync\"\nmax_off_policy_steps = 2\n",
            "grpo.max_off_policy_steps",
        ),
        ("[grpo]\nreward_timeout_s = -1.0\n", "grpo.reward_timeout_s"),
        ("[grpo.loss]\nbeta = -0.1\n", "grpo.loss.beta"),
        ("[optimizer]\nlr = -1.0\n", "optimizer.lr"),
        (
            "[tasks]\nkind = \"arithmetic\"\nlevels = [\"hard\"]\n",
            "tasks.levels",
        ),
        ("[eval]\nsamples = 0\n", "eval.samples"),
    ];
    for (section, expected) in cases {
        let (field, reason) = field_of(load(&format!("{MINIMAL}{section}"), &[]));
        assert_eq!(field, expected, "for {section:?}: {reason}");
    }
}

#[test]
fn mistyped_enum_value_is_named() {
    let (field, reason) = field_of(load(&format!("{MINIMAL}[grpo]\nmode = \"fast\"\n"), &[]));
    assert_eq!(field, "grpo.mode");
    assert!(reason.contains("sync"), "{reason}");
}

#[test]
fn invalid_reward_options_name_the_reward() {
    let text = format!("{MINIMAL}[rewards.fmt]\nkind = \"format_regex\"\npattern = \"(\"\n");
    let (field, _) = field_of(load(&text, &[]));
    assert_eq!(field, "rewards.fmt");
}

#[test]
fn set_overrides_are_applied_and_checked() {
    let config = load(MINIMAL, &["grpo.group_size=4", "optimizer.lr=1e-4"]).unwrap();
    assert_eq!(config.settings.group_size, 4);
    assert!(matches!(&config.settings.optimizer, OptimizerConfig::AdamW(a) if a.lr == 1e-4));
    let (field, _) = field_of(load(MINIMAL, &["grpo.gruop_size=4"]));
    assert_eq!(field, "grpo.gruop_size");
    let (field, _) = field_of(load(MINIMAL, &["no-equals-sign"]));
    assert!(field.starts_with("--set"), "{field}");
}

#[test]
fn schedule_keys_of_another_kind_are_refused() {
    let (field, _) = field_of(load(
        // A WSD key under a constant schedule (the default kind is WSD, as in every command).
        &format!("{MINIMAL}[schedule]\nkind = \"constant\"\ndecay_steps = 4\n"),
        &[],
    ));
    assert_eq!(field, "schedule.decay_steps");
}

#[test]
fn shipped_grpo_tiny_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/grpo-tiny.toml");
    let config = GrpoConfig::load(&path, &[]).unwrap();
    assert_eq!(config.settings.group_size, 8);
    assert_eq!(config.settings.max_new_tokens, 64);
    assert!(config.model.ends_with("runs/speedrun/model"));
    assert!(matches!(
        config.held_out,
        Some(TaskSource::Arithmetic { problems: 100, .. })
    ));
}

#[test]
fn shipped_grpo_code_repair_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/grpo-code-repair.toml");
    let config = GrpoConfig::load(&path, &[]).unwrap();
    assert!(matches!(
        &config.tasks,
        TaskSource::CodeRepair { max_bugs: 2, templates, .. } if templates.is_empty()
    ));
    assert!(config.model.ends_with("runs/sft-code-repair/model"));
    assert!(matches!(
        config.held_out,
        Some(TaskSource::CodeRepair {
            problems: 48,
            seed: 1,
            ..
        })
    ));
    assert_eq!(
        config.settings.environment.as_ref().unwrap().kind.name(),
        "code_repair"
    );
}

#[test]
fn resume_differences_ignore_length_and_cadence_but_not_the_math() {
    use stoke_pipeline::config::resume_differences;
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "run.toml", FULL);
    let load_with = |sets: &[&str]| {
        // A constant schedule: a cosine one over `grpo.steps` changes with the run's length.
        let mut sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        sets.push("schedule.kind=constant".into());
        GrpoConfig::load(&path, &sets).unwrap()
    };
    let saved = load_with(&[]);
    let longer = load_with(&[
        "grpo.steps=40",
        "eval.every=2",
        "checkpoint.keep=5",
        "grpo.activation_checkpointing=true",
    ]);
    let free = resume_differences(&saved, &longer);
    assert!(free.is_empty(), "{free:?}");
    let changed = load_with(&[
        "grpo.group_size=3",
        "optimizer.lr=1e-3",
        "grpo.precision=\"bf16\"",
    ]);
    assert_eq!(changed.settings.precision, stoke_types::Precision::Bf16);
    assert!(longer.settings.activation_checkpointing);
    let keys: Vec<String> = resume_differences(&saved, &changed)
        .into_iter()
        .map(|(key, _, _)| key)
        .collect();
    assert_eq!(
        keys,
        ["grpo.group_size", "optimizer.lr", "training.precision"]
    );
}

#[test]
fn the_old_clip_name_is_read_as_the_shared_one_and_both_are_refused() {
    let old = load(&format!("{MINIMAL}[grpo]\nclip_grad_norm = 0.25\n"), &[]).unwrap();
    assert_eq!(old.settings.clip_grad_norm, Some(0.25));
    let new = load(
        &format!("{MINIMAL}[optimizer]\nclip_grad_norm = 0.25\n"),
        &[],
    )
    .unwrap();
    assert_eq!(new.settings, old.settings);
    let set = load(MINIMAL, &["grpo.clip_grad_norm=0"]).unwrap();
    assert_eq!(set.settings.clip_grad_norm, None);
    // The saved config writes the new name only.
    let text = new.to_toml().unwrap();
    assert!(!text.contains("[grpo]\nclip_grad_norm"), "{text}");
    let (field, reason) = field_of(load(
        &format!("{MINIMAL}[grpo]\nclip_grad_norm = 0.25\n[optimizer]\nclip_grad_norm = 1.0\n"),
        &[],
    ));
    assert_eq!(field, "grpo.clip_grad_norm");
    assert!(reason.contains("optimizer.clip_grad_norm"), "{reason}");
    let (field, _) = field_of(load(MINIMAL, &["optimizer.clip_grad_norm=-1"]));
    assert_eq!(field, "optimizer.clip_grad_norm");
}

#[test]
fn remote_services_resolve_round_trip_and_name_their_errors() {
    use stoke_pipeline::remote::{Engine, Routing};
    let text = format!(
        "{MINIMAL}[rollout]\nkind = \"remote\"\nservers = [\"http://a:8000\", \"http://b:8000/v1\"]\n\
         routing = \"round_robin\"\nengine = \"vllm\"\nmodel = \"policy\"\nweights_dir = \"shared/w\"\n\
         [reward]\nkind = \"remote\"\nservers = [\"http://r:8100\"]\ntimeout_s = 5\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "remote.toml", &text);
    let config = GrpoConfig::load(&path, &[]).unwrap();
    let rollout = config.settings.services.rollout.clone().unwrap();
    assert_eq!(rollout.pool.servers.len(), 2);
    assert_eq!(rollout.pool.routing, Routing::RoundRobin);
    assert_eq!(rollout.pool.max_in_flight, 4);
    assert_eq!(rollout.pool.timeout.as_secs(), 600);
    assert_eq!(rollout.engine, Engine::Vllm);
    assert_eq!(rollout.model.as_deref(), Some("policy"));
    assert_eq!(
        rollout.weights_dir,
        std::path::absolute(dir.path()).unwrap().join("shared/w")
    );
    let reward = config.settings.services.reward.clone().unwrap();
    assert_eq!(reward.routing, Routing::LeastLoaded);
    assert_eq!(reward.timeout.as_secs(), 5);
    assert_eq!(reward.max_in_flight, 8);
    let other = tempfile::tempdir().unwrap();
    let saved = write(other.path(), "c.toml", &config.to_toml().unwrap());
    assert_eq!(GrpoConfig::load(&saved, &[]).unwrap(), config);
    // Local by default; the published weights default into the run folder.
    assert_eq!(
        load(MINIMAL, &[]).unwrap().settings.services,
        Default::default()
    );
    let defaulted = load(
        MINIMAL,
        &[
            "rollout.kind=\"remote\"",
            "rollout.servers=[\"http://a:1\"]",
        ],
    )
    .unwrap();
    let rollout = defaulted.settings.services.rollout.unwrap();
    assert_eq!(
        rollout.weights_dir,
        defaulted.out_dir.join("published-weights")
    );
    assert_eq!(rollout.engine, Engine::Stoke);
    // Moving a module is not a change of the training: resume allows it.
    let local = GrpoConfig::load(&write(dir.path(), "local.toml", MINIMAL), &[]).unwrap();
    assert_eq!(
        stoke_pipeline::config::resume_differences(&local, &config),
        Vec::new()
    );

    for (sets, field, reason) in [
        (
            vec!["rollout.kind=\"remote\""],
            "rollout.servers",
            "at least one server",
        ),
        (
            vec!["rollout.kind=\"remote\"", "rollout.servers=[\"a:1\"]"],
            "rollout.servers[0]",
            "not an http",
        ),
        (
            vec![
                "rollout.kind=\"remote\"",
                "rollout.servers=[\"http://a\", \"http://a\"]",
            ],
            "rollout.servers[1]",
            "listed twice",
        ),
        (
            vec!["rollout.servers=[\"http://a\"]"],
            "rollout.servers",
            "kind = \"remote\" only",
        ),
        (
            vec!["rollout.engine=\"vllm\""],
            "rollout.engine",
            "kind = \"remote\" only",
        ),
        (
            vec!["reward.model=\"x\""],
            "reward.model",
            "belongs to [rollout]",
        ),
        (
            vec![
                "reward.kind=\"remote\"",
                "reward.servers=[\"http://r\"]",
                "reward.max_in_flight=0",
            ],
            "reward.max_in_flight",
            "at least 1",
        ),
        (
            vec![
                "reward.kind=\"remote\"",
                "reward.servers=[\"http://r\"]",
                "reward.timeout_s=-1",
            ],
            "reward.timeout_s",
            "positive",
        ),
    ] {
        let (got_field, got_reason) = field_of(load(MINIMAL, &sets));
        assert_eq!(got_field, field, "{sets:?}: {got_reason}");
        assert!(got_reason.contains(reason), "{sets:?}: {got_reason}");
    }
}

#[test]
fn a_remote_reference_is_resolved_and_its_misuses_named() {
    use stoke_pipeline::remote::Engine;
    let remote = [
        "reference.kind=\"remote\"",
        "reference.servers=[\"http://teacher:8000\"]",
        "reference.engine=\"vllm\"",
    ];
    let config = load(MINIMAL, &remote).unwrap();
    let reference = config.settings.services.reference.clone().unwrap();
    assert_eq!(reference.engine, Engine::Vllm);
    assert_eq!(reference.pool.servers, ["http://teacher:8000"]);
    let dir = tempfile::tempdir().unwrap();
    let saved = write(dir.path(), "c.toml", &config.to_toml().unwrap());
    assert_eq!(GrpoConfig::load(&saved, &[]).unwrap(), config);
    // On-policy distillation with the teacher on servers needs no local teacher folder.
    let mut distill = remote.to_vec();
    distill.push("grpo.loss.distill.kl_coef=1.0");
    assert!(load(MINIMAL, &distill).is_ok());
    let (field, reason) = field_of(load(MINIMAL, &["grpo.loss.distill.kl_coef=1.0"]));
    assert_eq!(field, "model.reference", "{reason}");
    let mut reset = remote.to_vec();
    reset.push("grpo.reference_reset_every=5");
    assert_eq!(
        field_of(load(MINIMAL, &reset)).0,
        "grpo.reference_reset_every"
    );
    let (field, _) = field_of(load(
        MINIMAL,
        &[
            "reference.kind=\"remote\"",
            "reference.servers=[\"http://t\"]",
            "reference.weights_dir=\"w\"",
        ],
    ));
    assert_eq!(field, "reference.weights_dir");
}

#[test]
fn an_environment_section_resolves_with_defaults_and_round_trips() {
    let text = format!(
        "{MINIMAL}[tasks]\nkind = \"calculator\"\ndigits = 6\nproblems = 50\n[grpo]\nmax_new_tokens = 96\n\
         [environment]\nkind = \"calculator\"\nmax_turns = 3\ntool_call_parser = \"hermes\"\n"
    );
    let config = load(&text, &[]).unwrap();
    let environment = config
        .settings
        .environment
        .as_ref()
        .expect("an environment");
    assert_eq!(environment.limits.max_turns, 3);
    // The per-turn budget defaults to grpo.max_new_tokens, the total to twice turns times that.
    assert_eq!(environment.limits.max_turn_tokens, 96);
    assert_eq!(environment.limits.max_total_tokens, 2 * 3 * 96);
    assert_eq!(environment.tools.timeout.as_secs(), 30);
    assert!(matches!(
        config.tasks,
        stoke_pipeline::config::TaskSource::Calculator {
            digits: 6,
            problems: 50,
            ..
        }
    ));
    // The held-out set defaults to the calculator task on another seed.
    assert!(matches!(
        config.held_out,
        Some(stoke_pipeline::config::TaskSource::Calculator { digits: 6, .. })
    ));
    let saved_text = config.to_toml().unwrap();
    assert!(saved_text.contains("[environment]"), "{saved_text}");
    let other = tempfile::tempdir().unwrap();
    let saved = write(other.path(), "config.toml", &saved_text);
    assert_eq!(GrpoConfig::load(&saved, &[]).unwrap(), config);
}

#[test]
fn bad_environment_values_name_their_key() {
    let base = format!("{MINIMAL}[environment]\nkind = \"calculator\"\n");
    for (line, key) in [
        ("max_turns = 0", "environment.max_turns"),
        ("tool_call_parser = \"xml\"", "environment.tool_call_parser"),
        ("tool_timeout_s = -1", "environment.tool_timeout_s"),
        (
            "max_tool_output_bytes = 0",
            "environment.max_tool_output_bytes",
        ),
    ] {
        let (field, reason) = field_of(load(&format!("{base}{line}\n"), &[]));
        assert_eq!(field, key, "{line}: {reason}");
    }
    let (field, _) = field_of(load(&format!("{base}turns = 3\n"), &[]));
    assert!(field.contains("environment"), "{field}");
    let (field, reason) = field_of(load(
        &format!("{MINIMAL}[environment]\nkind = \"browser\"\n"),
        &[],
    ));
    assert!(
        field.contains("environment") && reason.contains("calculator"),
        "{field}: {reason}"
    );
}

#[test]
fn a_tools_environment_takes_builtins_and_mcp_servers_and_only_it_does() {
    let text = format!(
        "{MINIMAL}[environment]\nkind = \"tools\"\ntools = [\"python\", \"calculator\"]\nrequires_tool = true\n\
         [[environment.mcp]]\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [\"server.py\"]\n"
    );
    let config = load(&text, &[]).unwrap();
    let environment = config.settings.environment.as_ref().unwrap();
    assert_eq!(environment.builtins.len(), 2);
    assert_eq!(environment.mcp.len(), 1);
    assert!(environment.requires_tool);
    let saved_text = config.to_toml().unwrap();
    let other = tempfile::tempdir().unwrap();
    let saved = write(other.path(), "config.toml", &saved_text);
    assert_eq!(
        GrpoConfig::load(&saved, &[]).unwrap(),
        config,
        "{saved_text}"
    );
    // Tool keys belong to kind "tools"; a tools kind needs something to offer; servers are checked.
    let (field, _) = field_of(load(
        &format!("{MINIMAL}[environment]\nkind = \"calculator\"\ntools = [\"bash\"]\n"),
        &[],
    ));
    assert_eq!(field, "environment.tools");
    let (field, _) = field_of(load(
        &format!("{MINIMAL}[environment]\nkind = \"tools\"\n"),
        &[],
    ));
    assert_eq!(field, "environment.tools");
    let (field, reason) = field_of(load(
        &format!(
            "{MINIMAL}[environment]\nkind = \"tools\"\n[[environment.mcp]]\ntransport = \"http\"\nurl = \"ftp://x\"\n"
        ),
        &[],
    ));
    assert_eq!(field, "environment.mcp[0]", "{reason}");
}

#[test]
fn an_openenv_environment_takes_its_server_table_and_only_it_does() {
    let text = format!(
        "{MINIMAL}[environment]\nkind = \"openenv\"\nmax_turns = 6\n\
         [environment.openenv]\nurl = \"http://127.0.0.1:8000\"\nobservation_field = \"prompt\"\n"
    );
    let config = load(&text, &[]).unwrap();
    let environment = config.settings.environment.as_ref().unwrap();
    assert_eq!(environment.kind.name(), "openenv");
    let spec = environment.openenv.as_ref().expect("the server table");
    assert_eq!(spec.url, "http://127.0.0.1:8000");
    // Defaults: the model's text goes in `message`; the opening is the task's prompt.
    assert_eq!(spec.action_field, "message");
    assert_eq!(spec.observation_field.as_deref(), Some("prompt"));
    assert_eq!(spec.opening, stoke_env::openenv::OpenEnvOpening::Task);
    let saved_text = config.to_toml().unwrap();
    assert!(
        saved_text.contains("[environment.openenv]") && saved_text.contains("action_field"),
        "{saved_text}"
    );
    let other = tempfile::tempdir().unwrap();
    let saved = write(other.path(), "config.toml", &saved_text);
    assert_eq!(
        GrpoConfig::load(&saved, &[]).unwrap(),
        config,
        "{saved_text}"
    );
    // Every key of the table, and one it does not have.
    let full = format!(
        "{MINIMAL}[environment]\nkind = \"openenv\"\n[environment.openenv]\nurl = \"ws://h:1/ws\"\n\
         action_field = \"command\"\nopening = \"reset\"\n"
    );
    let config = load(&full, &[]).unwrap();
    let spec = config.settings.environment.unwrap().openenv.unwrap();
    assert_eq!(spec.action_field, "command");
    assert_eq!(spec.opening, stoke_env::openenv::OpenEnvOpening::Reset);
    let (field, reason) = field_of(load(&format!("{full}timeout = 3\n"), &[]));
    assert!(
        field.contains("environment") && reason.contains("timeout"),
        "{field}: {reason}"
    );
    // The table belongs to kind "openenv", which needs it; its values are checked.
    let (field, _) = field_of(load(
        &format!(
            "{MINIMAL}[environment]\nkind = \"guess_number\"\n[environment.openenv]\nurl = \"http://h:1\"\n"
        ),
        &[],
    ));
    assert_eq!(field, "environment.openenv");
    let (field, _) = field_of(load(
        &format!("{MINIMAL}[environment]\nkind = \"openenv\"\n"),
        &[],
    ));
    assert_eq!(field, "environment.openenv");
    for (line, key) in [
        ("url = \"https://x.hf.space\"", "environment.openenv.url"),
        ("url = \"h:1\"", "environment.openenv.url"),
        (
            "url = \"http://h:1\"\naction_field = \"\"",
            "environment.openenv.action_field",
        ),
    ] {
        let (field, reason) = field_of(load(
            &format!("{MINIMAL}[environment]\nkind = \"openenv\"\n[environment.openenv]\n{line}\n"),
            &[],
        ));
        assert_eq!(field, key, "{line}: {reason}");
    }
}

#[test]
fn code_repair_tasks_and_environment_resolve_and_round_trip() {
    let text = format!(
        "{MINIMAL}[training]\nseed = 7\n[tasks]\nkind = \"code_repair\"\nproblems = 40\nmax_bugs = 1\n\
         templates = [\"sum_to\", \"clamp\"]\n[eval]\nproblems = 12\n\
         [environment]\nkind = \"code_repair\"\nmax_turns = 3\n"
    );
    let config = load(&text, &[]).unwrap();
    assert_eq!(
        config.tasks,
        TaskSource::CodeRepair {
            problems: 40,
            seed: 7,
            max_bugs: 1,
            templates: vec!["sum_to".into(), "clamp".into()],
        }
    );
    // The held-out set defaults to the same kind of task on the seed + 1 stream.
    assert_eq!(
        config.held_out,
        Some(TaskSource::CodeRepair {
            problems: 12,
            seed: 8,
            max_bugs: 1,
            templates: vec!["sum_to".into(), "clamp".into()],
        })
    );
    let environment = config.settings.environment.as_ref().unwrap();
    assert_eq!(environment.kind.name(), "code_repair");
    assert_eq!(environment.limits.max_turns, 3);
    let saved_text = config.to_toml().unwrap();
    assert!(saved_text.contains("code_repair"), "{saved_text}");
    let other = tempfile::tempdir().unwrap();
    let saved = write(other.path(), "config.toml", &saved_text);
    assert_eq!(
        GrpoConfig::load(&saved, &[]).unwrap(),
        config,
        "{saved_text}"
    );

    // Defaults: two bugs at most, every template; an explicit held-out set keeps its own keys.
    let text = format!(
        "{MINIMAL}[tasks]\nkind = \"code_repair\"\n[held_out]\nkind = \"code_repair\"\nseed = 99\n\
         problems = 5\n[environment]\nkind = \"code_repair\"\n"
    );
    let config = load(&text, &[]).unwrap();
    assert!(matches!(
        &config.tasks,
        TaskSource::CodeRepair { max_bugs: 2, templates, .. } if templates.is_empty()
    ));
    assert!(matches!(
        config.held_out,
        Some(TaskSource::CodeRepair {
            seed: 99,
            problems: 5,
            ..
        })
    ));
}

#[test]
fn bad_code_repair_values_name_their_key() {
    let environment = "[environment]\nkind = \"code_repair\"\n";
    for (tasks, key) in [
        ("max_bugs = 3", "tasks.max_bugs"),
        ("max_bugs = 0", "tasks.max_bugs"),
        ("templates = [\"sum_to\", \"quicksort\"]", "tasks.templates"),
        ("templates = []", "tasks.templates"),
        ("problems = 0", "tasks.problems"),
    ] {
        let text = format!("{MINIMAL}[tasks]\nkind = \"code_repair\"\n{tasks}\n{environment}");
        let (field, reason) = field_of(load(&text, &[]));
        assert_eq!(field, key, "{tasks}: {reason}");
    }
    let (field, reason) = field_of(load(
        &format!(
            "{MINIMAL}[tasks]\nkind = \"code_repair\"\n{environment}[held_out]\nkind = \"code_repair\"\nmax_bugs = 5\n"
        ),
        &[],
    ));
    assert_eq!(field, "held_out.max_bugs", "{reason}");
    let (field, _) = field_of(load(
        &format!("{MINIMAL}[tasks]\nkind = \"code_repair\"\ncount = 3\n{environment}"),
        &[],
    ));
    assert!(field.contains("tasks"), "{field}");
    // The environment's tool keys are kind "tools"'s.
    let (field, _) = field_of(load(
        &format!("{MINIMAL}[tasks]\nkind = \"code_repair\"\n{environment}tools = [\"python\"]\n"),
        &[],
    ));
    assert_eq!(field, "environment.tools");
}

#[test]
fn code_repair_tasks_and_environment_go_together() {
    // The environment without its tasks (the default arithmetic, a JSONL file, calculator).
    for tasks in [
        "",
        "[tasks]\nkind = \"jsonl\"\npath = \"tasks.jsonl\"\n",
        "[tasks]\nkind = \"calculator\"\n",
    ] {
        let (field, reason) = field_of(load(
            &format!("{MINIMAL}{tasks}[environment]\nkind = \"code_repair\"\n"),
            &[],
        ));
        assert_eq!(field, "tasks.kind", "{tasks}: {reason}");
        assert!(reason.contains("code_repair"), "{reason}");
    }
    // The tasks without the environment, or in another one.
    for environment in ["", "[environment]\nkind = \"calculator\"\n"] {
        let (field, reason) = field_of(load(
            &format!("{MINIMAL}[tasks]\nkind = \"code_repair\"\n{environment}"),
            &[],
        ));
        assert_eq!(field, "tasks.kind", "{environment}: {reason}");
    }
    // A held-out set of another kind.
    let (field, reason) = field_of(load(
        &format!(
            "{MINIMAL}[tasks]\nkind = \"code_repair\"\n[held_out]\nkind = \"calculator\"\n\
             [environment]\nkind = \"code_repair\"\n"
        ),
        &[],
    ));
    assert_eq!(field, "held_out.kind", "{reason}");
}
