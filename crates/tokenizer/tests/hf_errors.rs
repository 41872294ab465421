//! `hf::Tokenizer` on bad input and streaming: every error names its file, field or id; the
//! incremental detokenizer returns whole characters only.

use std::path::{Path, PathBuf};

use stoke_tokenizer::error::TokenizerError;
use stoke_tokenizer::hf::Tokenizer;

fn qwen2_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizers/qwen2")
}

/// A temporary copy of the qwen2 fixture tokenizer (tokenizer.json and tokenizer_config.json).
fn copy_of_qwen2() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(qwen2_dir().join(file), dir.path().join(file)).expect("copy fixture");
    }
    dir
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
}

#[test]
fn missing_tokenizer_json_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::MissingFile { path } if path.ends_with("tokenizer.json")),
        "{err}"
    );
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn malformed_config_json_reports_file_line_and_column() {
    let dir = copy_of_qwen2();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        "{\n  \"eos_token\": \"<|im_end|>\",\n  oops\n}",
    )
    .unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    match &err {
        TokenizerError::Json {
            path, line, column, ..
        } => {
            assert!(path.ends_with("tokenizer_config.json"));
            assert_eq!((*line, *column), (3, 3));
        }
        other => panic!("expected a JSON error, got {other}"),
    }
    assert!(err.to_string().contains("line 3, column 3"), "{err}");
}

#[test]
fn malformed_tokenizer_json_reports_line() {
    let dir = copy_of_qwen2();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        "{\"version\": \"1.0\",\n\"model\": [",
    )
    .unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Json { path, line: 2, .. } if path.ends_with("tokenizer.json")),
        "{err}"
    );
}

#[test]
fn unknown_eos_token_names_the_field_and_token() {
    let dir = copy_of_qwen2();
    edit_json(&dir.path().join("tokenizer_config.json"), |v| {
        v["eos_token"] = "<|no_such_token|>".into()
    });
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, TokenizerError::Field { field, .. } if field == "eos_token"),
        "{text}"
    );
    assert!(
        text.contains("tokenizer_config.json") && text.contains("<|no_such_token|>"),
        "{text}"
    );
}

#[test]
fn eos_token_as_added_token_object_is_read() {
    let dir = copy_of_qwen2();
    edit_json(&dir.path().join("tokenizer_config.json"), |v| {
        v["eos_token"] = serde_json::json!({"content": "<|endoftext|>", "special": true})
    });
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tokenizer.eos_token_ids(), vec![292]);
}

#[test]
fn special_tokens_map_fills_only_keys_the_config_lacks() {
    // transformers 5.24 on the same files: eos from the map (config has no key), pad stays unset
    // (config says null), bos from the config.
    let dir = copy_of_qwen2();
    edit_json(&dir.path().join("tokenizer_config.json"), |v| {
        v.as_object_mut().unwrap().remove("eos_token");
        v["pad_token"] = serde_json::Value::Null;
    });
    std::fs::write(
        dir.path().join("special_tokens_map.json"),
        r#"{"eos_token": {"content": "<|endoftext|>"}, "pad_token": "<|im_start|>", "bos_token": "<|im_start|>"}"#,
    )
    .unwrap();
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tokenizer.eos_token(), Some("<|endoftext|>"));
    assert_eq!(tokenizer.pad_token_id(), None);
    assert_eq!(tokenizer.bos_token(), None);
}

#[test]
fn tokenizer_config_wins_over_special_tokens_map() {
    let dir = copy_of_qwen2();
    std::fs::write(
        dir.path().join("special_tokens_map.json"),
        r#"{"eos_token": "<|endoftext|>"}"#,
    )
    .unwrap();
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tokenizer.eos_token(), Some("<|im_end|>"));
}

#[test]
fn generation_config_eos_may_be_a_single_int() {
    let dir = copy_of_qwen2();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": 292}"#,
    )
    .unwrap();
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tokenizer.eos_token_ids(), vec![294, 292]);
}

#[test]
fn generation_config_eos_outside_vocabulary_is_an_error() {
    let dir = copy_of_qwen2();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [294, 100000]}"#,
    )
    .unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("generation_config.json")
            && text.contains("eos_token_id")
            && text.contains("100000"),
        "{text}"
    );
}

#[test]
fn chat_template_jinja_file_replaces_the_config_template() {
    let dir = copy_of_qwen2();
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{% for m in messages %}[{{ m.content }}]{% endfor %}",
    )
    .unwrap();
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    let template = tokenizer.chat_template().expect("template");
    let messages = [stoke_tokenizer::chat::ChatMessage::user("hi")];
    let text = template
        .render_text(&messages, &Default::default())
        .unwrap();
    assert_eq!(text, "[hi]");
}

#[test]
fn chat_template_list_of_named_templates_is_read() {
    let dir = copy_of_qwen2();
    edit_json(&dir.path().join("tokenizer_config.json"), |v| {
        v["chat_template"] = serde_json::json!([
            {"name": "default", "template": "D{{ messages|length }}"},
            {"name": "tool_use", "template": "T"}
        ])
    });
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tokenizer.chat_template_names(), vec!["default", "tool_use"]);
    let text = tokenizer
        .chat_template()
        .unwrap()
        .render_text(
            &[stoke_tokenizer::chat::ChatMessage::user("x")],
            &Default::default(),
        )
        .unwrap();
    assert_eq!(text, "D1");
    assert!(tokenizer.chat_template_named("tool_use").is_some());
    // With a `tools` variable, transformers picks the "tool_use" template.
    let messages = [stoke_tokenizer::chat::ChatMessage::user("x")];
    let mut options = stoke_tokenizer::chat::ChatOptions::default();
    let tools = stoke_tokenizer::chat::TemplateValue::from(vec!["t"]);
    options.variables.insert("tools".into(), tools);
    assert_eq!(
        tokenizer
            .apply_chat_template(&messages, &options)
            .unwrap()
            .text,
        "T"
    );
}

#[test]
fn named_templates_without_a_default_give_no_default() {
    let dir = copy_of_qwen2();
    edit_json(&dir.path().join("tokenizer_config.json"), |v| {
        v["chat_template"] = serde_json::json!([{"name": "rag", "template": "R"}])
    });
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert!(tokenizer.chat_template().is_none());
    assert!(tokenizer.chat_template_named("rag").is_some());
}

#[test]
fn decode_of_unknown_id_is_an_error_naming_the_id() {
    let tokenizer = Tokenizer::from_dir(&qwen2_dir()).unwrap();
    let err = tokenizer.decode(&[39, 68, 5000], false).unwrap_err();
    assert!(
        matches!(
            err,
            TokenizerError::UnknownTokenId {
                id: 5000,
                vocab_size: 295
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("5000"));
}

#[test]
fn stream_decode_joins_to_full_decode_across_split_utf8() {
    let tokenizer = Tokenizer::from_dir(&qwen2_dir()).unwrap();
    let text = "Café ☕ 中文 🦀 naïve<|im_end|>";
    let ids = tokenizer.encode(text, false).unwrap();
    // The tiny vocabulary has few merges, so multi-byte characters span several byte tokens.
    assert!(
        ids.len() > text.chars().count(),
        "expected characters split over tokens"
    );
    let mut stream = tokenizer.decode_stream(false);
    let mut pieces = Vec::new();
    let mut silent_steps = 0;
    for &id in &ids {
        match stream.step(&tokenizer, id).unwrap() {
            Some(piece) => pieces.push(piece),
            None => silent_steps += 1,
        }
    }
    assert_eq!(stream.finish(&tokenizer).unwrap(), None);
    assert!(
        silent_steps > 0,
        "a partial character must hold output back"
    );
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    assert_eq!(pieces.concat(), tokenizer.decode(&ids, false).unwrap());
    assert_eq!(pieces.concat(), text);
}

#[test]
fn stream_finish_returns_an_incomplete_character_as_replacement() {
    let tokenizer = Tokenizer::from_dir(&qwen2_dir()).unwrap();
    let ids = tokenizer.encode("a🦀", false).unwrap();
    let mut stream = tokenizer.decode_stream(false);
    let mut text = String::new();
    for &id in &ids[..ids.len() - 1] {
        text.extend(stream.step(&tokenizer, id).unwrap());
    }
    assert_eq!(text, "a");
    assert_eq!(
        stream.finish(&tokenizer).unwrap().as_deref(),
        Some("\u{FFFD}")
    );
}

#[test]
fn stream_step_rejects_unknown_id() {
    let tokenizer = Tokenizer::from_dir(&qwen2_dir()).unwrap();
    let mut stream = tokenizer.decode_stream(false);
    let err = stream.step(&tokenizer, 99_999).unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnknownTokenId { id: 99_999, .. }),
        "{err}"
    );
}

#[test]
fn template_that_fails_to_compile_does_not_stop_loading() {
    // transformers compiles chat templates lazily; plain encoding must still work.
    let dir = copy_of_qwen2();
    edit_json(&dir.path().join("tokenizer_config.json"), |v| {
        v["chat_template"] = "{% for m in messages %}unclosed".into()
    });
    let tokenizer = Tokenizer::from_dir(dir.path()).expect("loads despite the template");
    assert!(!tokenizer.encode("Hello", false).unwrap().is_empty());
    assert!(tokenizer.chat_template().is_none());
    let messages = [stoke_tokenizer::chat::ChatMessage::user("hi")];
    let err = tokenizer
        .apply_chat_template(&messages, &Default::default())
        .unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Template { template, .. } if template == "default"),
        "{err}"
    );
    assert!(err.to_string().contains("line 1"), "{err}");
}

#[test]
fn apply_chat_template_without_template_says_so() {
    let dir = copy_of_qwen2();
    edit_json(&dir.path().join("tokenizer_config.json"), |v| {
        v.as_object_mut().unwrap().remove("chat_template");
    });
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    let err = tokenizer
        .apply_chat_template(&[], &Default::default())
        .unwrap_err();
    assert!(
        matches!(err, TokenizerError::NoChatTemplate { name: None }),
        "{err}"
    );
}

#[test]
fn tokenizer_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<stoke_tokenizer::hf::DecodeStream>();
}
