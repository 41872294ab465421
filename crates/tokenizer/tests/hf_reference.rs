//! `hf::Tokenizer` against transformers: `fixtures/tokenizers/*/reference.json` records ids with
//! and without special tokens and decodes with and without `skip_special_tokens`; the checkpoint
//! `fixtures/models/qwen2_bias_tied` adds a `generation_config.json` with more eos ids.

use std::path::PathBuf;

use serde::Deserialize;
use stoke_tokenizer::hf::Tokenizer;

#[derive(Deserialize)]
struct Reference {
    vocab_size_with_specials: usize,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    special_token_ids: std::collections::BTreeMap<String, u32>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids_add_special_tokens: Vec<u32>,
    ids_no_special_tokens: Vec<u32>,
    decoded: String,
    decoded_skip_special_tokens: String,
}

fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(path)
}

fn load(name: &str) -> (Tokenizer, Reference) {
    let dir = fixture(&format!("tokenizers/{name}"));
    let tokenizer = Tokenizer::from_dir(&dir).expect("fixture tokenizer loads");
    let text =
        std::fs::read_to_string(dir.join("reference.json")).expect("reference.json is committed");
    (
        tokenizer,
        serde_json::from_str(&text).expect("reference.json parses"),
    )
}

fn check_cases(name: &str) {
    let (tokenizer, reference) = load(name);
    assert!(reference.cases.len() >= 5);
    for case in &reference.cases {
        let with = tokenizer.encode(&case.text, true).expect("encode");
        assert_eq!(
            with, case.ids_add_special_tokens,
            "{name}: ids with special tokens of {:?}",
            case.text
        );
        let without = tokenizer.encode(&case.text, false).expect("encode");
        assert_eq!(
            without, case.ids_no_special_tokens,
            "{name}: ids without special tokens of {:?}",
            case.text
        );
        let decoded = tokenizer
            .decode(&case.ids_add_special_tokens, false)
            .expect("decode");
        assert_eq!(decoded, case.decoded, "{name}: decode of {:?}", case.text);
        let skipped = tokenizer
            .decode(&case.ids_add_special_tokens, true)
            .expect("decode");
        assert_eq!(
            skipped, case.decoded_skip_special_tokens,
            "{name}: decode(skip) of {:?}",
            case.text
        );
    }
}

#[test]
fn qwen2_encode_and_decode_match_transformers() {
    check_cases("qwen2");
}

#[test]
fn llama3_encode_and_decode_match_transformers() {
    check_cases("llama3");
}

#[test]
fn special_tokens_come_from_the_configs() {
    for name in ["qwen2", "llama3"] {
        let (tokenizer, reference) = load(name);
        assert_eq!(
            tokenizer.vocab_size(),
            reference.vocab_size_with_specials,
            "{name}"
        );
        assert_eq!(
            tokenizer.bos_token(),
            reference.bos_token.as_deref(),
            "{name}"
        );
        assert_eq!(
            tokenizer.eos_token(),
            reference.eos_token.as_deref(),
            "{name}"
        );
        let pad_id = reference
            .pad_token
            .as_ref()
            .map(|t| reference.special_token_ids[t]);
        assert_eq!(tokenizer.pad_token_id(), pad_id, "{name}");
        for (token, &id) in &reference.special_token_ids {
            assert_eq!(tokenizer.token_to_id(token), Some(id), "{name}: {token}");
            assert_eq!(
                tokenizer.id_to_token(id).as_deref(),
                Some(token.as_str()),
                "{name}: {id}"
            );
        }
    }
}

#[test]
fn eos_ids_are_the_union_of_tokenizer_config_and_generation_config() {
    // tokenizer_config eos `<|im_end|>` = 294; generation_config eos_token_id [294, 292].
    let tokenizer = Tokenizer::from_dir(&fixture("models/qwen2_bias_tied"))
        .expect("checkpoint tokenizer loads");
    assert_eq!(tokenizer.eos_token_ids(), vec![294, 292]);
    // Without generation_config.json only the config's eos remains.
    let (plain, _) = load("qwen2");
    assert_eq!(plain.eos_token_ids(), vec![294]);
}
