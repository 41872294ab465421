//! `stoke export`: a model folder released with its tokenizer, chat template and a model card
//! (lineage from run folders, eval figures from `stoke eval run`), the weights unchanged; a
//! model with a non-finite weight is refused by tensor name and nothing is written; an existing
//! folder is replaced only with --force.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture() -> PathBuf {
    root().join("fixtures/models/qwen2_bias_tied")
}

fn stoke(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
        .args(args)
        .output()
        .expect("stoke runs")
}

fn ok(args: &[&str]) -> String {
    let out = stoke(args);
    assert!(
        out.status.success(),
        "stoke {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tensors(path: &Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect();
    out.sort();
    out
}

#[test]
fn a_model_is_released_with_its_card_and_a_broken_one_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let path = |p: &str| work.path().join(p).display().to_string();
    // A run folder as `stoke train` leaves one (its resolved config), and an eval run.
    let run = work.path().join("sft-run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(
        run.join("config.toml"),
        "title = \"sft of the fixture\"\noutput_dir = \"sft-run\"\n[model]\npretrained = \"base\"\n\
         [data]\nkind = \"chat\"\ntrain = [\"chat.jsonl\"]\nseq_len = 64\nmicro_batch_size = 2\n\
         [training]\nsteps = 40\n",
    )
    .unwrap();
    let fixture_str = fixture().display().to_string();
    let task = root()
        .join("fixtures/eval/mc_arith.toml")
        .display()
        .to_string();
    ok(&[
        "eval",
        "run",
        "--task",
        &task,
        "--model",
        &fixture_str,
        "--out",
        &path("eval"),
        "--progress-every",
        "0",
    ]);
    ok(&[
        "export",
        "--model",
        &fixture_str,
        "--out",
        &path("release"),
        "--lineage",
        &path("sft-run"),
        "--eval",
        &path("eval"),
        "--name",
        "fixture-chat",
    ]);
    let release = work.path().join("release");
    for file in [
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    ] {
        assert!(release.join(file).is_file(), "release/{file}");
    }
    assert_eq!(
        tensors(&release.join("model.safetensors")),
        tensors(&fixture().join("model.safetensors")),
        "the released weights are the model's"
    );
    let card = std::fs::read_to_string(release.join("README.md")).unwrap();
    for expected in [
        "# fixture-chat",
        "library_name: transformers",
        "| sft of the fixture | supervised fine-tuning (chat) | base | chat.jsonl | 40 |",
        "| mc_arith | ",
        "| acc | ",
        "Qwen2",
    ] {
        assert!(
            card.contains(expected),
            "no {expected:?} in the card:\n{card}"
        );
    }
    // The release loads and runs.
    ok(&["inspect", "--model", &path("release")]);

    // An existing folder is not replaced silently.
    let error = stoke(&["export", "--model", &fixture_str, "--out", &path("release")]);
    assert!(!error.status.success());
    assert!(String::from_utf8_lossy(&error.stderr).contains("--force"));
    ok(&[
        "export",
        "--model",
        &fixture_str,
        "--out",
        &path("release"),
        "--force",
    ]);

    // A NaN in the weights: refused by tensor name, nothing written.
    let broken = work.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    for entry in std::fs::read_dir(fixture()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), broken.join(entry.file_name())).unwrap();
    }
    let weights = broken.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let end = bytes.len();
    // The data section ends the file: its last f32 becomes NaN.
    bytes[end - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&weights, bytes).unwrap();
    let out = stoke(&[
        "export",
        "--model",
        &broken.display().to_string(),
        "--out",
        &path("broken-release"),
    ]);
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains("non-finite") && error.contains("tensor "),
        "{error}"
    );
    assert!(!work.path().join("broken-release").exists());
    let leftovers: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".export-"))
        .collect();
    assert!(leftovers.is_empty(), "no staging folder is left behind");
}

/// Regression: a `stoke dpo` run folder held no config.toml, so `--lineage` refused it as "not a
/// run folder" and a DPO stage could not be in the card; a LoRA stage did not say it was LoRA.
#[test]
fn the_card_records_a_lora_stage_and_a_dpo_stage_with_their_settings() {
    let work = tempfile::tempdir().unwrap();
    let path = |p: &str| work.path().join(p).display().to_string();
    // An SFT run with LoRA, its config as `stoke train` writes it back.
    let sft = work.path().join("sft-lora");
    std::fs::create_dir_all(&sft).unwrap();
    std::fs::write(
        sft.join("config.toml"),
        "title = \"sft with lora\"\noutput_dir = \"sft-lora\"\n[model]\npretrained = \"base\"\n\
         [data]\nkind = \"chat\"\ntrain = [\"chat.jsonl\"]\nseq_len = 64\nmicro_batch_size = 2\n\
         [training]\nsteps = 30\n[lora]\nr = 8\nlora_alpha = 16.0\nlora_dropout = 0.0\n\
         target_modules = [\"q_proj\", \"v_proj\"]\nuse_rslora = true\n",
    )
    .unwrap();
    // A real `stoke dpo` run on the fixture.
    let pairs: Vec<String> = (0..4)
        .map(|k| {
            serde_json::json!({
                "prompt": format!("add {k} 1"),
                "chosen": format!("sum {}", k + 1),
                "rejected": format!("sum {}", k + 2),
            })
            .to_string()
        })
        .collect();
    std::fs::write(work.path().join("pairs.jsonl"), pairs.join("\n") + "\n").unwrap();
    std::fs::write(
        work.path().join("dpo.toml"),
        format!(
            "title = \"dpo on pairs\"\noutput_dir = \"dpo-run\"\n[model]\npretrained = \"{}\"\n\
             [data]\ntrain = \"pairs.jsonl\"\nmax_len = 120\npairs_per_micro_batch = 2\n\
             micro_batches = 1\n[objective]\nkind = \"dpo\"\n[dpo]\nloss_type = \"apo_zero\"\n\
             [training]\nsteps = 2\n",
            fixture().display()
        ),
    )
    .unwrap();
    ok(&["dpo", &path("dpo.toml"), "--quiet"]);
    assert!(work.path().join("dpo-run/config.toml").is_file());
    ok(&[
        "export",
        "--model",
        &path("dpo-run/model"),
        "--out",
        &path("release"),
        "--lineage",
        &path("sft-lora"),
        "--lineage",
        &path("dpo-run"),
    ]);
    let card = std::fs::read_to_string(work.path().join("release/README.md")).unwrap();
    for expected in [
        "| sft with lora | supervised fine-tuning (chat), LoRA (rank 8, alpha 16.0, target \
         modules q_proj, v_proj, rsLoRA) | base | chat.jsonl | 30 |",
        "| dpo on pairs | preference optimization (DPO, apo_zero) | ",
        "pairs.jsonl | 2 |",
    ] {
        assert!(
            card.contains(expected),
            "no {expected:?} in the card:\n{card}"
        );
    }
}
