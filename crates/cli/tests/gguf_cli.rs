//! GGUF through the CLI: `stoke convert` both ways, `stoke export --gguf`, `stoke generate` on a
//! .gguf file, and `stoke train` fine-tuning a GGUF model (config and tokenizer from its metadata,
//! the result saved as a Hugging Face folder with the tokenizer built from the GGUF).

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
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

fn greedy(model: &str) -> serde_json::Value {
    let text = ok(&[
        "generate",
        "--model",
        model,
        "--prompt-ids",
        "1,17,250,42",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
    ]);
    let line: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON line");
    line["token_ids"].clone()
}

#[test]
fn convert_export_generate_and_train_on_gguf() {
    let work = tempfile::tempdir().unwrap();
    let path = |p: &str| work.path().join(p).display().to_string();
    let gguf = root()
        .join("fixtures/gguf/qwen2_mixed.gguf")
        .display()
        .to_string();

    // GGUF -> folder -> GGUF (f32): the same greedy tokens from all three.
    ok(&["convert", &gguf, &path("folder")]);
    ok(&[
        "convert",
        &path("folder"),
        &path("back.gguf"),
        "--type",
        "f32",
    ]);
    let expected = greedy(&gguf);
    assert_eq!(greedy(&path("folder")), expected);
    assert_eq!(greedy(&path("back.gguf")), expected);
    let inspected: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", "--model", &gguf])).expect("inspect prints JSON");
    assert_eq!(inspected["config"]["vocab_size"], 300);
    // An existing output is kept unless --force.
    let again = stoke(&["convert", &gguf, &path("folder")]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    // The release step writes Q8_0.
    ok(&[
        "export",
        "--model",
        &path("folder"),
        "--out",
        &path("release.gguf"),
        "--gguf",
        "q8_0",
    ]);
    assert!(std::fs::metadata(path("release.gguf")).unwrap().len() > 10_000);
    // Not a GGUF file: a one-line error naming it.
    std::fs::write(path("fake.gguf"), b"GGUF\x07\0\0\0").unwrap();
    let bad = stoke(&[
        "generate",
        "--model",
        &path("fake.gguf"),
        "--prompt-ids",
        "1",
    ]);
    assert!(!bad.status.success());
    let message = String::from_utf8_lossy(&bad.stderr);
    assert!(
        message.contains("fake.gguf") && message.contains("version 7"),
        "{message}"
    );

    // Fine-tuning straight from the GGUF.
    let data = path("train.jsonl");
    let lines: Vec<String> = (0..8)
        .map(|i| {
            serde_json::json!({"messages": [
                {"role": "user", "content": format!("What is {i} plus {i}?")},
                {"role": "assistant", "content": format!("It is {}.", 2 * i)},
            ]})
            .to_string()
        })
        .collect();
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let config = format!(
        "title = \"sft-gguf\"\noutput_dir = \"{}\"\n[model]\npretrained = \"{gguf}\"\n\
         [data]\nkind = \"chat\"\ntrain = [\"{data}\"]\nseq_len = 192\nmicro_batch_size = 4\n\
         [optimizer]\nkind = \"adamw\"\nlr = 1e-3\n[training]\nsteps = 2\n",
        path("run")
    );
    std::fs::write(path("sft.toml"), config).unwrap();
    ok(&["train", &path("sft.toml")]);
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(
            work.path().join("run/model").join(file).is_file(),
            "run/model/{file}"
        );
    }
    let chat = ok(&[
        "generate",
        "--model",
        &path("run/model"),
        "--prompt",
        "What is 3 plus 3?",
        "--chat",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
    ]);
    assert!(chat.contains("token_ids"), "{chat}");
}

/// Regression: `--type bf16` printed `(Bf16 weights)`; types are named as GGUF spells them.
#[test]
fn convert_names_the_weight_type_as_gguf_spells_it() {
    let work = tempfile::tempdir().unwrap();
    let folder = work.path().join("folder").display().to_string();
    let gguf = root()
        .join("fixtures/gguf/qwen2_mixed.gguf")
        .display()
        .to_string();
    ok(&["convert", &gguf, &folder]);
    for (flag, name) in [("bf16", "BF16"), ("q8_0", "Q8_0"), ("f16", "F16")] {
        let out = work
            .path()
            .join(format!("{flag}.gguf"))
            .display()
            .to_string();
        let printed = ok(&["convert", &folder, &out, "--type", flag]);
        assert!(printed.contains(&format!("({name} weights)")), "{printed}");
    }
}
