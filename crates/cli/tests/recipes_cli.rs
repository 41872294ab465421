//! `stoke r1` and `stoke rft` end to end on a tiny random model (hidden 32, one layer, a 300-token
//! BPE with a ChatML template): the four stage folders and the final model appear, each stage
//! starts from the previous stage's model, a rerun skips finished stages, a removed stage runs
//! again, a stage stopped after a checkpoint continues from it (refused when its config
//! changed); config mistakes are named before any stage runs. `stoke rlaif` on the same model as
//! policy and judge: every prompt's record, the pairs, the DPO run and the before/after ratings.

use std::path::Path;
use std::process::{Command, Output};

mod common;

fn stoke() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
}

/// `dir/model` (a tiny random Llama with tokenizer files) and `dir/sft.jsonl` (arithmetic chats).
fn setup(dir: &Path) {
    let conversations: Vec<(String, String)> = (0..16)
        .map(|i| {
            (
                format!("Mia has {i} shells. She finds 2 more. How many shells does Mia have now?"),
                format!("Mia has {i} + 2 = {} shells.\n#### {}", i + 2, i + 2),
            )
        })
        .collect();
    let texts: Vec<String> = conversations
        .iter()
        .map(|(q, a)| format!("{q} {a}"))
        .collect();
    common::tiny_chat_model(dir, &texts);
    let lines: Vec<String> = conversations
        .iter()
        .map(|(q, a)| {
            serde_json::json!({"messages": [
                {"role": "user", "content": q}, {"role": "assistant", "content": a}
            ]})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("sft.jsonl"), lines.join("\n") + "\n").unwrap();
}

/// One GRPO stage: a single sync update of 2 prompts x 2 samples, evaluated on 2 problems.
fn grpo_stage(name: &str) -> String {
    format!(
        "[{name}.tasks]\nkind = \"arithmetic\"\nproblems = 4\n\
         [{name}.grpo]\nsteps = 1\nprompts_per_step = 2\ngroup_size = 2\nmax_new_tokens = 6\n\
         mode = \"sync\"\nthreads = 1\nreward_workers = 1\n\
         [{name}.optimizer]\nlr = 1e-4\n\
         [{name}.eval]\nproblems = 2\nsamples = 2\n"
    )
}

/// The rejection stage; the reward accepts any text (the random model is never right), and
/// truncated completions are kept (it rarely stops on its own).
const REJECTION: &str = r#"
[rejection.tasks]
kind = "arithmetic"
problems = 3
[rejection.rewards.default]
kind = "format_regex"
pattern = ".*"
[rejection.sampling]
samples = 3
keep_per_prompt = 2
max_new_tokens = 6
keep_truncated = true
reward_workers = 1
[rejection.sft]
data = { seq_len = 128, micro_batch_size = 4 }
schedule = { kind = "constant" }
training = { steps = 2 }
"#;

fn r1_config() -> String {
    format!(
        "[model]\npath = \"model\"\n[out]\ndir = \"out\"\n\
         [cold_start]\noptimizer = {{ lr = 1e-3 }}\nschedule = {{ kind = \"constant\" }}\n\
         training = {{ steps = 2 }}\n\
         [cold_start.data]\nkind = \"chat\"\ntrain = [\"sft.jsonl\"]\nseq_len = 128\n\
         micro_batch_size = 4\n{}{REJECTION}{}",
        grpo_stage("reasoning_rl"),
        grpo_stage("final_rl")
    )
}

fn run(args: &[&str], config: &Path) -> Output {
    stoke()
        .args(args)
        .arg(config)
        .arg("--quiet")
        .current_dir("/")
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn statuses(out: &Path) -> Vec<String> {
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("r1.json")).unwrap()).unwrap();
    summary["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn r1_runs_four_stages_in_order_and_a_rerun_skips_finished_ones() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let config = dir.path().join("r1.toml");
    std::fs::write(&config, r1_config()).unwrap();

    let first = run(&["r1"], &config);
    assert!(first.status.success(), "{}", text(&first));
    let out = dir.path().join("out");
    for model in [
        "1-cold-start/model",
        "2-reasoning-rl/model",
        "3-rejection-sft/sft/model",
        "4-final-rl/model",
    ] {
        assert!(
            out.join(model).join("model.safetensors").is_file(),
            "{model} missing; {}",
            text(&first)
        );
    }
    assert_eq!(statuses(&out), ["ran", "ran", "ran", "ran"]);
    // Each stage starts from the previous stage's model.
    let rl_config = std::fs::read_to_string(out.join("2-reasoning-rl/config.toml")).unwrap();
    assert!(rl_config.contains("1-cold-start/model"), "{rl_config}");
    let sft_config = std::fs::read_to_string(out.join("3-rejection-sft/sft/config.toml")).unwrap();
    assert!(sft_config.contains("2-reasoning-rl/model"), "{sft_config}");
    assert!(
        sft_config.contains("3-rejection-sft/rft.jsonl"),
        "{sft_config}"
    );
    let final_config = std::fs::read_to_string(out.join("4-final-rl/config.toml")).unwrap();
    assert!(
        final_config.contains("3-rejection-sft/sft/model"),
        "{final_config}"
    );
    // 3 tasks x 3 samples, at most 2 kept per task.
    let kept = std::fs::read_to_string(out.join("3-rejection-sft/rft.jsonl")).unwrap();
    let lines = kept.lines().count();
    assert!((1..=6).contains(&lines), "{lines} lines");
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(stdout.contains("held-out greedy pass@1"), "{stdout}");

    let final_weights = std::fs::read(out.join("4-final-rl/model/model.safetensors")).unwrap();
    let again = run(&["r1"], &config);
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(statuses(&out), ["skipped"; 4]);
    assert_eq!(
        std::fs::read(out.join("4-final-rl/model/model.safetensors")).unwrap(),
        final_weights
    );

    // A stage removed (as if the run had stopped in it) runs again; the others stay skipped.
    std::fs::remove_dir_all(out.join("4-final-rl")).unwrap();
    let resumed = run(&["r1"], &config);
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert_eq!(statuses(&out), ["skipped", "skipped", "skipped", "ran"]);
    assert!(out.join("4-final-rl/model/model.safetensors").is_file());

    // A stage stopped after its last checkpoint continues from it, unless its config changed.
    std::fs::remove_dir_all(out.join("4-final-rl/model")).unwrap();
    let changed = stoke()
        .args(["r1", "--quiet", "--set", "final_rl.grpo.group_size=3"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!changed.status.success());
    assert!(
        String::from_utf8_lossy(&changed.stderr).contains("grpo.group_size: 2 -> 3"),
        "{}",
        text(&changed)
    );
    let continued = run(&["r1"], &config);
    assert!(continued.status.success(), "{}", text(&continued));
    assert!(
        String::from_utf8_lossy(&continued.stderr).contains("resuming GRPO from"),
        "{}",
        text(&continued)
    );
    assert!(out.join("4-final-rl/model/model.safetensors").is_file());
}

#[test]
fn r1_names_a_bad_key_before_running_any_stage() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let config = dir.path().join("r1.toml");
    let bad = r1_config().replace("[final_rl.grpo]\nsteps = 1", "[final_rl.grpo]\nstepz = 1");
    std::fs::write(&config, bad).unwrap();
    let output = run(&["r1"], &config);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("stepz") && stderr.contains("final_rl"),
        "{stderr}"
    );
    assert!(!dir.path().join("out/1-cold-start").exists());

    // A key the recipe owns is refused in an inline stage.
    let owned = r1_config().replace("[cold_start]\n", "[cold_start]\noutput_dir = \"x\"\n");
    std::fs::write(&config, owned).unwrap();
    let output = run(&["r1"], &config);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`output_dir`"), "{stderr}");
}

#[test]
fn rft_samples_filters_and_fine_tunes() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let rejection = REJECTION.replace("[rejection.", "[");
    let config = dir.path().join("rft.toml");
    std::fs::write(
        &config,
        format!("[model]\npath = \"model\"\n[out]\ndir = \"out\"\n{rejection}"),
    )
    .unwrap();
    let output = run(&["rft"], &config);
    assert!(output.status.success(), "{}", text(&output));
    let out = dir.path().join("out");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("rejection.json")).unwrap())
            .unwrap();
    assert_eq!(report["prompts"], 3);
    assert_eq!(report["samples"], 9);
    let kept = report["kept"].as_u64().unwrap() as usize;
    let lines = std::fs::read_to_string(out.join("rft.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), kept);
    assert!(out.join("sft/model/model.safetensors").is_file());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("rejection sampling: 3 prompts"), "{stdout}");
}

/// `stoke distill generate`: the teacher's samples with their token ids, every distinct one kept
/// (verify off by default), counts in generate.json; a student SFT on the file trains on the ids
/// (no line skipped); a student with another tokenizer is refused before any sampling.
#[test]
fn distill_generate_writes_token_ids_a_student_trains_on() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let config = dir.path().join("generate.toml");
    std::fs::write(
        &config,
        "[model]\npath = \"model\"\n[tasks]\nkind = \"arithmetic\"\nproblems = 3\n\
         [sampling]\nsamples = 2\nmax_new_tokens = 6\nkeep_truncated = true\nreward_workers = 1\n\
         [out]\ndir = \"out\"\n",
    )
    .unwrap();
    let output = run(&["distill", "generate"], &config);
    assert!(output.status.success(), "{}", text(&output));
    let out = dir.path().join("out");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("generate.json")).unwrap()).unwrap();
    assert_eq!(report["prompts"], 3);
    assert_eq!(report["samples"], 6);
    let tokenizer = stoke_tokenizer::hf::Tokenizer::from_dir(&dir.path().join("model")).unwrap();
    let lines = std::fs::read_to_string(out.join("distill.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len() as u64, report["kept"].as_u64().unwrap());
    assert!(!lines.is_empty());
    for line in &lines {
        let ids = |key: &str| -> Vec<u32> {
            line[key]
                .as_array()
                .unwrap_or_else(|| panic!("no {key} in {line}"))
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect()
        };
        let (prompt, completion) = (ids("prompt_ids"), ids("completion_ids"));
        assert!(!completion.is_empty() && completion.len() <= 6, "{line}");
        // The prompt ids are the teacher's chat-template rendering of the question.
        let question = line["messages"][0]["content"].as_str().unwrap();
        let rendered = tokenizer.decode(&prompt, false).unwrap();
        assert!(rendered.contains(question), "{rendered:?} vs {question:?}");
        assert!(
            rendered.ends_with("<|im_start|>assistant\n"),
            "{rendered:?}"
        );
        assert_eq!(
            tokenizer.decode(&completion, false).unwrap(),
            line["messages"][1]["content"].as_str().unwrap()
        );
    }

    // The student's SFT takes every line (by its ids).
    let sft = dir.path().join("student.toml");
    std::fs::write(
        &sft,
        "output_dir = \"student\"\n[model]\npretrained = \"model\"\n\
         [data]\nkind = \"chat\"\ntrain = [\"out/distill.jsonl\"]\nseq_len = 128\nmicro_batch_size = 2\n\
         [schedule]\nkind = \"constant\"\n[training]\nsteps = 1\n",
    )
    .unwrap();
    let output = run(&["train"], &sft);
    assert!(output.status.success(), "{}", text(&output));
    // A skipped or truncated line would be reported ("warning: ... N skipped").
    let all = text(&output);
    assert!(!all.contains("distill.jsonl:"), "{all}");
    assert!(!all.contains("skipped"), "{all}");

    // With the teacher's top-3 stored, a student distils from the file alone (no teacher model).
    let output = run(
        &[
            "distill",
            "generate",
            "--set",
            "model.top_k_logprobs=3",
            "--set",
            "out.dir=\"out_topk\"",
        ],
        &config,
    );
    assert!(output.status.success(), "{}", text(&output));
    let stored = std::fs::read_to_string(dir.path().join("out_topk/distill.jsonl")).unwrap();
    for line in stored.lines() {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        let tokens = line["completion_ids"].as_array().unwrap().len();
        let ids = line["teacher_topk_ids"].as_array().unwrap();
        let logprobs = line["teacher_topk_logprobs"].as_array().unwrap();
        assert_eq!((ids.len(), logprobs.len()), (tokens, tokens), "{line}");
        for row in logprobs {
            let row: Vec<f64> = row
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            assert_eq!(row.len(), 3);
            assert!(
                row[0] >= row[1] && row[1] >= row[2] && row[0] <= 0.0,
                "{row:?}"
            );
        }
    }
    let distill = |data: &str, name: &str| {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "output_dir = \"{name}\"\n[model]\npretrained = \"model\"\n\
                 [data]\nkind = \"chat\"\ntrain = [\"{data}\"]\nseq_len = 128\nmicro_batch_size = 2\n\
                 [schedule]\nkind = \"constant\"\n[training]\nsteps = 2\n[distill]\nbeta = 0.0\n"
            ),
        )
        .unwrap();
        run(&["train"], &path)
    };
    let output = distill("out_topk/distill.jsonl", "stored");
    assert!(output.status.success(), "{}", text(&output));
    assert!(dir.path().join("stored/model/model.safetensors").is_file());
    // GKD's on-policy regime through a run config: every micro-batch is the student's own
    // replies to the conversations' prompts, scored by the teacher model.
    let on_policy = dir.path().join("on_policy.toml");
    std::fs::write(
        &on_policy,
        "output_dir = \"on_policy\"\n[model]\npretrained = \"model\"\n\
         [data]\nkind = \"chat\"\ntrain = [\"sft.jsonl\"]\nseq_len = 128\nmicro_batch_size = 2\n\
         [schedule]\nkind = \"constant\"\n[training]\nsteps = 2\n\
         [distill]\nteacher = \"model\"\nlmbda = 1.0\nmax_new_tokens = 4\n",
    )
    .unwrap();
    let output = run(&["train"], &on_policy);
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        dir.path()
            .join("on_policy/model/model.safetensors")
            .is_file()
    );
    let output = distill("out/distill.jsonl", "nothing");
    assert!(!output.status.success());
    assert!(
        text(&output).contains("carry no teacher top-k"),
        "{}",
        text(&output)
    );

    // A student over another tokenizer is refused, naming it.
    let other = tempfile::tempdir().unwrap();
    common::tiny_chat_model(other.path(), &vec!["zebra quartz jumps".to_string(); 4]);
    let student = other.path().join("model");
    let output = run(
        &[
            "distill",
            "generate",
            "--set",
            &format!("model.student=\"{}\"", student.display()),
        ],
        &config,
    );
    assert!(!output.status.success());
    let all = text(&output);
    assert!(all.contains("not the teacher's tokenizer"), "{all}");
    assert!(all.contains(&student.display().to_string()), "{all}");
}

#[test]
fn rlaif_writes_records_and_pairs_trains_dpo_and_rates_before_and_after() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    // The judge's requests (instructions, principle, quoted answer) outgrow the tiny model's
    // 256 positions in its 300-token vocabulary; a random model takes a longer context as well.
    let config_path = dir.path().join("model/config.json");
    let mut model_config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    model_config["max_position_embeddings"] = 2048.into();
    std::fs::write(&config_path, model_config.to_string()).unwrap();
    std::fs::write(
        dir.path().join("principles.md"),
        "# Principles\n\n- Answer with the number.\n- Be brief.\n",
    )
    .unwrap();
    let prompts: Vec<String> = (0..6)
        .map(|i| {
            serde_json::json!({"prompt": format!("Mia has {i} shells. She finds 2 more.")})
                .to_string()
        })
        .collect();
    std::fs::write(dir.path().join("prompts.jsonl"), prompts.join("\n") + "\n").unwrap();
    // The random judge never writes a readable verdict, so the check is off: every non-empty
    // revision that differs from the answer is kept.
    let config = r#"
principles = "principles.md"
[policy]
model = "model"
[judge]
model = "model"
[prompts]
file = "prompts.jsonl"
held_out = 2
[sampling]
max_tokens = 8
judge_max_tokens = 8
judge_temperature = 1.0
judge_check = false
concurrency = 2
[dpo]
training = { steps = 2 }
data = { max_len = 96 }
[out]
dir = "out"
"#;
    let path = dir.path().join("rlaif.toml");
    std::fs::write(&path, config).unwrap();
    let output = run(&["rlaif"], &path);
    assert!(output.status.success(), "{}", text(&output));
    let out = dir.path().join("out");
    let records: Vec<serde_json::Value> = std::fs::read_to_string(out.join("rlaif.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 4, "every training prompt has a record");
    let kept: Vec<&serde_json::Value> = records.iter().filter(|r| r["kept"] == true).collect();
    for record in &records {
        assert!(
            record["response"].is_string() && record["critique"].is_string(),
            "{record}"
        );
        assert!(
            record["kept"] == true || record["dropped"].is_string(),
            "a record is kept or says why not: {record}"
        );
    }
    let pairs: Vec<serde_json::Value> = std::fs::read_to_string(out.join("pairs.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(pairs.len(), kept.len());
    assert!(!pairs.is_empty(), "{}", text(&output));
    for (pair, record) in pairs.iter().zip(&kept) {
        assert_eq!(pair["chosen"][0]["content"], record["revision"]);
        assert_eq!(pair["rejected"][0]["content"], record["response"]);
    }
    assert!(out.join("dpo/model/model.safetensors").exists());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("rlaif.json")).unwrap()).unwrap();
    assert_eq!(report["report"]["pairs"], pairs.len());
    for side in ["before", "after"] {
        let r = &report[side];
        let total = r["rated"].as_u64().unwrap()
            + r["unreadable"].as_u64().unwrap()
            + r["failed"].as_u64().unwrap();
        assert_eq!(total, 2, "{side}: {r}");
        assert_eq!(r["failed"], 0, "{side}: {r}");
    }

    // A rerun reuses the pairs; pairs made with other settings are refused, not reused.
    let again = run(&["rlaif"], &path);
    assert!(
        again.status.success() && text(&again).contains("pairs already written"),
        "{}",
        text(&again)
    );
    std::fs::write(
        &path,
        config.replace("max_tokens = 8\n", "max_tokens = 9\n"),
    )
    .unwrap();
    let changed = run(&["rlaif"], &path);
    assert!(
        !changed.status.success() && text(&changed).contains("other principles"),
        "{}",
        text(&changed)
    );

    // The recipe owns the DPO's output folder; a typo'd key is named before any sampling.
    for (bad, expect) in [
        ("[dpo]\noutput_dir = \"x\"\n", "output_dir"),
        ("[sampling]\ntemprature = 1.0\n", "temprature"),
    ] {
        let broken = format!("{}{bad}", config.split("[sampling]").next().unwrap());
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, broken).unwrap();
        let output = run(&["rlaif"], &path);
        assert!(
            !output.status.success() && text(&output).contains(expect),
            "{}",
            text(&output)
        );
        assert!(!dir.path().join("runs/bad").exists(), "nothing ran");
    }
}
