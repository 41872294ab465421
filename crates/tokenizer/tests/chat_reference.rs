//! Chat templates against transformers: `fixtures/chat/reference.json` holds, for the real
//! Qwen2.5-Instruct and Llama-3.2-Instruct templates, the text and ids of `apply_chat_template`
//! and the assistant masks of the `{% generation %}`-tagged variants (see fixtures/README.md).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use stoke_tokenizer::chat::{ChatMessage, ChatOptions, MaskSource, TemplateValue};
use stoke_tokenizer::hf::Tokenizer;

#[derive(Deserialize)]
struct Reference {
    tokenizers: BTreeMap<String, TokenizerCases>,
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
    add_generation_prompt: bool,
    template_kwargs: BTreeMap<String, TemplateValue>,
    text: String,
    input_ids: Vec<u32>,
    assistant_masks: Vec<u8>,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load_reference() -> Reference {
    let path = repo_root().join("fixtures/chat/reference.json");
    let text = std::fs::read_to_string(&path).expect("fixtures/chat/reference.json is committed");
    serde_json::from_str(&text).expect("reference.json parses")
}

fn options(case: &Case) -> ChatOptions {
    ChatOptions {
        add_generation_prompt: case.add_generation_prompt,
        variables: case.template_kwargs.clone(),
    }
}

fn expected_mask(case: &Case) -> Vec<bool> {
    case.assistant_masks.iter().map(|&m| m == 1).collect()
}

/// Runs `check` on every recorded case of every tokenizer, collecting failures so one run shows
/// all of them.
fn for_each_case(check: impl Fn(&Tokenizer, &str, &Case) -> Result<(), String>) {
    let reference = load_reference();
    assert_eq!(reference.tokenizers.len(), 2, "qwen2 and llama3");
    let mut failures = Vec::new();
    let mut count = 0;
    for (name, cases) in &reference.tokenizers {
        let tokenizer = Tokenizer::from_dir(&repo_root().join(&cases.tokenizer_dir))
            .expect("fixture tokenizer loads");
        let generation_source = std::fs::read_to_string(
            repo_root()
                .join(&cases.tokenizer_dir)
                .join("chat_template_generation.jinja"),
        )
        .expect("generation-tagged template is committed");
        for case in &cases.cases {
            count += 1;
            if let Err(message) = check(&tokenizer, &generation_source, case) {
                failures.push(format!("{name}/{}: {message}", case.name));
            }
        }
    }
    assert!(count >= 12, "expected 6 cases per tokenizer, found {count}");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn real_templates_render_the_same_text_and_ids_as_transformers() {
    for_each_case(|tokenizer, _, case| {
        let encoding = tokenizer
            .apply_chat_template(&case.messages, &options(case))
            .map_err(|e| e.to_string())?;
        if encoding.text != case.text {
            return Err(format!(
                "text differs:\n ours: {:?}\n hf:   {:?}",
                encoding.text, case.text
            ));
        }
        if encoding.ids != case.input_ids {
            return Err(format!(
                "ids differ:\n ours: {:?}\n hf:   {:?}",
                encoding.ids, case.input_ids
            ));
        }
        Ok(())
    });
}

#[test]
fn generation_tagged_templates_give_transformers_assistant_masks() {
    for_each_case(|tokenizer, source, case| {
        let template = tokenizer
            .chat_template_from_source("generation", source)
            .map_err(|e| e.to_string())?;
        if template.mask_source() != MaskSource::GenerationTags {
            return Err("generation tags not detected".into());
        }
        let encoding = template
            .encode(tokenizer, &case.messages, &options(case))
            .map_err(|e| e.to_string())?;
        if encoding.text != case.text || encoding.ids != case.input_ids {
            return Err(format!(
                "tagged template renders differently: {:?}",
                encoding.text
            ));
        }
        if encoding.assistant_mask != expected_mask(case) {
            return Err(format!(
                "mask differs:\n ours: {:?}\n hf:   {:?}",
                encoding.assistant_mask, case.assistant_masks
            ));
        }
        Ok(())
    });
}

#[test]
fn prefix_rendering_mask_of_untagged_templates_equals_transformers_tagged_mask() {
    for_each_case(|tokenizer, _, case| {
        let template = tokenizer.chat_template().ok_or("no chat template")?;
        if template.mask_source() != MaskSource::PrefixRendering {
            return Err("real template unexpectedly has generation tags".into());
        }
        let encoding = template
            .encode(tokenizer, &case.messages, &options(case))
            .map_err(|e| e.to_string())?;
        if encoding.assistant_mask != expected_mask(case) {
            return Err(format!(
                "mask differs:\n ours: {:?}\n hf:   {:?}",
                encoding.assistant_mask, case.assistant_masks
            ));
        }
        Ok(())
    });
}

#[test]
fn some_recorded_case_has_assistant_tokens() {
    // Guards the mask tests above against passing on all-zero masks only.
    let reference = load_reference();
    let marked: usize = reference
        .tokenizers
        .values()
        .flat_map(|t| &t.cases)
        .map(|c| c.assistant_masks.iter().filter(|&&m| m == 1).count())
        .sum();
    assert!(
        marked > 20,
        "only {marked} assistant tokens in the fixtures"
    );
}

#[test]
fn llama3_template_uses_strftime_now_when_no_date_is_given() {
    // Llama 3.x templates print `strftime_now("%d %b %Y")` as "Today Date" unless `date_string`
    // is passed; the rest of the rendering must equal the recorded one.
    let reference = load_reference();
    let cases = &reference.tokenizers["llama3"];
    let tokenizer = Tokenizer::from_dir(&repo_root().join(&cases.tokenizer_dir)).unwrap();
    let case = &cases.cases[0];
    let options = ChatOptions {
        add_generation_prompt: case.add_generation_prompt,
        ..Default::default()
    };
    let text = tokenizer
        .chat_template()
        .unwrap()
        .render_text(&case.messages, &options)
        .unwrap();
    let start = text.find("Today Date: ").expect("date line") + "Today Date: ".len();
    let date = &text[start..start + 11];
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    assert!(date[..2].chars().all(|c| c.is_ascii_digit()), "{date}");
    assert!(months.contains(&&date[3..6]), "{date}");
    assert!(date[7..].parse::<u32>().is_ok_and(|y| y >= 2024), "{date}");
    assert_eq!(text.replace(date, "26 Jul 2024"), case.text);
}
