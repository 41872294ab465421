//! Chat templates against transformers on cases that fixtures/chat/reference.json does not
//! cover: assistant tool calls (arguments as an ordered map with non-ASCII text and a float
//! Python prints as `1e-07`), consecutive tool results, a `tools` list (printed with `tojson` and
//! `tojson(indent=4)`), empty or blank contents, and `tests/chat_data/jinja_features.jinja`, a
//! template exercising the jinja2 features HF templates use. Recorded by
//! `tests/chat_data/make_extra_reference.py` with transformers 5.24 on the fixture tokenizers.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use stoke_tokenizer::chat::{ChatMessage, ChatOptions, TemplateValue};
use stoke_tokenizer::hf::Tokenizer;

#[derive(Deserialize)]
struct Reference {
    tokenizers: BTreeMap<String, TokenizerCases>,
    jinja_features: FeatureCases,
    message_preparation: MessagePreparation,
}

#[derive(Deserialize)]
struct MessagePreparation {
    tokenizer_dir: String,
    fields: FieldsCase,
    split_char_mask: SplitCharCase,
}

#[derive(Deserialize)]
struct FieldsCase {
    template: String,
    messages: Vec<ChatMessage>,
    text: String,
}

#[derive(Deserialize)]
struct SplitCharCase {
    template: String,
    messages: Vec<ChatMessage>,
    input_ids: Vec<u32>,
    assistant_masks: Vec<u8>,
}

#[derive(Deserialize)]
struct FeatureCases {
    tokenizer_dir: String,
    cases: Vec<FeatureCase>,
}

#[derive(Deserialize)]
struct FeatureCase {
    name: String,
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    text: String,
}

#[derive(Deserialize)]
struct TokenizerCases {
    tokenizer_dir: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<ChatMessage>,
    tools: Option<TemplateValue>,
    add_generation_prompt: bool,
    template_kwargs: BTreeMap<String, TemplateValue>,
    text: String,
    input_ids: Vec<u32>,
    assistant_masks: Vec<u8>,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/chat_data")
}

fn load_reference() -> Reference {
    let path = data_dir().join("extra_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("committed")).expect("parses")
}

fn load() -> Vec<(String, Tokenizer, String, Case)> {
    let reference = load_reference();
    let mut all = Vec::new();
    for (name, cases) in reference.tokenizers {
        let dir = repo_root().join(&cases.tokenizer_dir);
        let generation =
            std::fs::read_to_string(dir.join("chat_template_generation.jinja")).unwrap();
        for case in cases.cases {
            all.push((
                name.clone(),
                Tokenizer::from_dir(&dir).unwrap(),
                generation.clone(),
                case,
            ));
        }
    }
    assert_eq!(all.len(), 8, "4 cases for each of 2 tokenizers");
    all
}

fn options(case: &Case) -> ChatOptions {
    let mut variables = case.template_kwargs.clone();
    if let Some(tools) = &case.tools {
        variables.insert("tools".into(), tools.clone());
    }
    ChatOptions {
        add_generation_prompt: case.add_generation_prompt,
        variables,
    }
}

#[test]
fn tool_calls_tools_and_blank_contents_render_as_in_transformers() {
    let mut failures = Vec::new();
    for (name, tokenizer, _, case) in load() {
        match tokenizer.apply_chat_template(&case.messages, &options(&case)) {
            Ok(encoding) if encoding.text == case.text && encoding.ids == case.input_ids => {}
            Ok(encoding) => failures.push(format!(
                "{name}/{}:\n ours: {:?}\n hf:   {:?}",
                case.name, encoding.text, case.text
            )),
            Err(err) => failures.push(format!("{name}/{}: {err}", case.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn generation_tagged_masks_of_tool_turns_equal_transformers() {
    let mut failures = Vec::new();
    for (name, tokenizer, generation, case) in load() {
        let template = tokenizer
            .chat_template_from_source("generation", &generation)
            .unwrap();
        let encoding = template
            .encode(&tokenizer, &case.messages, &options(&case))
            .unwrap();
        let expected: Vec<bool> = case.assistant_masks.iter().map(|&m| m == 1).collect();
        if encoding.assistant_mask != expected {
            failures.push(format!(
                "{name}/{}:\n ours: {:?}\n hf:   {:?}",
                case.name, encoding.assistant_mask, expected
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn prefix_rendering_masks_differ_from_tagged_ones_only_by_the_newline_qwen_puts_before_tool_calls()
{
    // Qwen writes a tool-call turn as "<|im_start|>assistant" + "\n<tool_call>...", and its tagged
    // template starts the generation block at that "\n"; the prefix-rendering mask starts after the
    // generation prompt "<|im_start|>assistant\n", which already holds it. Everything else agrees.
    let mut differing_cases = Vec::new();
    for (name, tokenizer, _, case) in load() {
        let encoding = tokenizer
            .apply_chat_template(&case.messages, &options(&case))
            .unwrap();
        let expected: Vec<bool> = case.assistant_masks.iter().map(|&m| m == 1).collect();
        let differing: Vec<usize> = (0..expected.len())
            .filter(|&i| encoding.assistant_mask[i] != expected[i])
            .collect();
        for &i in &differing {
            assert!(
                expected[i] && !encoding.assistant_mask[i],
                "{name}/{}: token {i}",
                case.name
            );
            assert_eq!(tokenizer.decode(&encoding.ids[i..=i], false).unwrap(), "\n");
        }
        if !differing.is_empty() {
            differing_cases.push(format!("{name}/{}", case.name));
        }
    }
    assert_eq!(
        differing_cases,
        ["qwen2/tool_call_turns", "qwen2/tool_call_turns_gen"]
    );
}

#[test]
fn jinja_features_render_as_jinja2_does() {
    let features = load_reference().jinja_features;
    let tokenizer = Tokenizer::from_dir(&repo_root().join(&features.tokenizer_dir)).unwrap();
    let source = std::fs::read_to_string(data_dir().join("jinja_features.jinja")).unwrap();
    let template = tokenizer
        .chat_template_from_source("jinja_features", &source)
        .unwrap();
    assert_eq!(features.cases.len(), 4);
    for case in &features.cases {
        let options = ChatOptions {
            add_generation_prompt: case.add_generation_prompt,
            ..Default::default()
        };
        let text = template.render_text(&case.messages, &options).unwrap();
        assert_eq!(
            text, case.text,
            "{} (generation prompt {})",
            case.name, case.add_generation_prompt
        );
    }
}

#[test]
fn null_fields_are_dropped_and_reasoning_fields_aliased_as_in_transformers() {
    let preparation = load_reference().message_preparation;
    let tokenizer = Tokenizer::from_dir(&repo_root().join(&preparation.tokenizer_dir)).unwrap();
    let fields = &preparation.fields;
    let template = tokenizer
        .chat_template_from_source("fields", &fields.template)
        .unwrap();
    let text = template
        .render_text(&fields.messages, &ChatOptions::default())
        .unwrap();
    assert_eq!(text, fields.text);
}

#[test]
fn mask_covers_every_token_of_a_character_split_at_the_end_of_a_block() {
    // "ok 🦀" ends the generation block; the crab is four byte-level tokens, all marked.
    let preparation = load_reference().message_preparation;
    let tokenizer = Tokenizer::from_dir(&repo_root().join(&preparation.tokenizer_dir)).unwrap();
    let case = &preparation.split_char_mask;
    let template = tokenizer
        .chat_template_from_source("split", &case.template)
        .unwrap();
    let encoding = template
        .encode(&tokenizer, &case.messages, &ChatOptions::default())
        .unwrap();
    assert_eq!(encoding.ids, case.input_ids);
    let expected: Vec<bool> = case.assistant_masks.iter().map(|&m| m == 1).collect();
    assert_eq!(encoding.assistant_mask, expected);
}
