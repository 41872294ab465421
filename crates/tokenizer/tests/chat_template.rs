//! `chat::ChatTemplate` on small hand-written templates: the jinja dialect of transformers
//! (whitespace rules, Python methods, `tojson`, `raise_exception`, `strftime_now`), extra
//! variables, content parts, and the assistant mask.

use std::collections::BTreeMap;
use std::path::PathBuf;

use stoke_tokenizer::chat::{
    ChatMessage, ChatOptions, ChatTemplate, ContentPart, MessageContent, TemplateTokens,
    TemplateValue,
};
use stoke_tokenizer::error::TokenizerError;
use stoke_tokenizer::hf::Tokenizer;

fn template(source: &str) -> ChatTemplate {
    let tokens = TemplateTokens {
        bos: Some("<s>".into()),
        eos: Some("</s>".into()),
        ..Default::default()
    };
    ChatTemplate::new("test", source, tokens, vec!["</s>".into()]).expect("template compiles")
}

fn render(
    source: &str,
    messages: &[ChatMessage],
    options: &ChatOptions,
) -> Result<String, TokenizerError> {
    template(source).render_text(messages, options)
}

fn one_message() -> Vec<ChatMessage> {
    vec![ChatMessage::user("x")]
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::user("Hi"),
        ChatMessage::assistant("Hello!"),
        ChatMessage::user("Bye"),
    ]
}

fn qwen2() -> Tokenizer {
    Tokenizer::from_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizers/qwen2"),
    )
    .unwrap()
}

#[test]
fn raise_exception_surfaces_the_message() {
    let source = "{% if messages[0].role != 'system' %}{{ raise_exception('First message must be system') }}{% endif %}";
    let err = render(source, &conversation(), &ChatOptions::default()).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Template { template, .. } if template == "test"),
        "{err}"
    );
    assert!(
        err.to_string().contains("First message must be system"),
        "{err}"
    );
}

#[test]
fn syntax_error_is_a_template_error_with_line() {
    let err = ChatTemplate::new(
        "broken",
        "line one\n{% if %}",
        TemplateTokens::default(),
        vec![],
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("broken") && text.contains("line 2"), "{text}");
}

#[test]
fn block_tags_trim_the_following_newline_and_leading_indent() {
    // trim_blocks + lstrip_blocks: the tag lines vanish, the text lines stay.
    let source = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
    let text = render(source, &conversation(), &ChatOptions::default()).unwrap();
    assert_eq!(text, "U:Hi\nU:Bye\n");
}

#[test]
fn single_trailing_newline_of_the_template_is_dropped() {
    let text = render(
        "{{ bos_token }}x\n",
        &one_message(),
        &ChatOptions::default(),
    )
    .unwrap();
    assert_eq!(text, "<s>x");
}

#[test]
fn python_string_and_dict_methods_work() {
    // Booleans print as Python prints them (`True`), as in jinja2.
    let source = "{{ messages[0].content.strip().upper() }}|{{ 'abc'.startswith('a') }}|{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}";
    let text = render(
        source,
        &[ChatMessage::user("  hi  ")],
        &ChatOptions::default(),
    )
    .unwrap();
    assert_eq!(text, "HI|True|a=1");
}

#[test]
fn loop_controls_work() {
    let source = "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if loop.index0 == 2 %}{% break %}{% endif %}{{ m.content }}{% endfor %}";
    let text = render(source, &conversation(), &ChatOptions::default()).unwrap();
    assert_eq!(text, "Hi");
}

#[test]
fn tojson_is_python_json_dumps_without_ascii_escaping() {
    let mut variables = BTreeMap::new();
    // Parsed from JSON text, so the key order ("name" before "n") is the insertion order that
    // Python's json.dumps keeps.
    let obj: TemplateValue =
        serde_json::from_str(r#"{"name": "café <b>", "n": [1, 2.5, null, true]}"#).unwrap();
    variables.insert("obj".into(), obj);
    let options = ChatOptions {
        variables,
        ..Default::default()
    };
    assert_eq!(
        render("{{ obj | tojson }}", &one_message(), &options).unwrap(),
        r#"{"name": "café <b>", "n": [1, 2.5, null, true]}"#
    );
    assert_eq!(
        render("{{ obj.n | tojson(indent=2) }}", &one_message(), &options).unwrap(),
        "[\n  1,\n  2.5,\n  null,\n  true\n]"
    );
    assert_eq!(
        render(
            "{{ obj.name | tojson(ensure_ascii=true) }}",
            &one_message(),
            &options
        )
        .unwrap(),
        r#""caf\u00e9 <b>""#
    );
}

#[test]
fn strftime_now_formats_the_current_date() {
    let text = render(
        "{{ strftime_now('%Y') }}",
        &one_message(),
        &ChatOptions::default(),
    )
    .unwrap();
    let year: i32 = text.parse().expect("a year");
    assert!((2024..3000).contains(&year), "{text}");
    let err = render(
        "{{ strftime_now('%Q') }}",
        &one_message(),
        &ChatOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("strftime_now"), "{err}");
}

#[test]
fn extra_variables_reach_the_template_and_tools_is_none() {
    let source = "{% if date_string is defined %}{{ date_string }}{% endif %}|{{ tools is none }}|{{ add_generation_prompt }}";
    let mut variables = BTreeMap::new();
    variables.insert("date_string".into(), TemplateValue::from("26 Jul 2024"));
    let options = ChatOptions {
        add_generation_prompt: true,
        variables,
    };
    assert_eq!(
        render(source, &one_message(), &options).unwrap(),
        "26 Jul 2024|True|True"
    );
}

#[test]
fn extra_variable_may_not_replace_messages() {
    let mut variables = BTreeMap::new();
    variables.insert(
        "messages".into(),
        TemplateValue::from(Vec::<TemplateValue>::new()),
    );
    let err = render(
        "x",
        &one_message(),
        &ChatOptions {
            variables,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("extra variable `messages`"),
        "{err}"
    );
}

#[test]
fn content_parts_are_joined_for_string_templates_and_kept_for_part_templates() {
    let parts = MessageContent::Parts(vec![
        ContentPart::Text { text: "a".into() },
        ContentPart::Text { text: "b".into() },
    ]);
    let message = ChatMessage {
        content: Some(parts),
        ..ChatMessage::user("")
    };
    let joined = render(
        "{{ messages[0].content + '!' }}",
        std::slice::from_ref(&message),
        &ChatOptions::default(),
    )
    .unwrap();
    assert_eq!(joined, "a\nb!");
    let walked = render(
        "{% for part in messages[0]['content'] %}[{{ part.text }}]{% endfor %}",
        &[message],
        &ChatOptions::default(),
    )
    .unwrap();
    assert_eq!(walked, "[a][b]");
}

#[test]
fn messages_deserialize_from_openai_json() {
    let json = r#"[{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                   {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": {"z": 1, "a": "é"}}}]}]"#;
    let messages: Vec<ChatMessage> = serde_json::from_str(json).unwrap();
    let text = render(
        "{{ messages[0].content }}|{{ messages[1].tool_calls[0].function.name }}|{{ messages[1].tool_calls[0].function.arguments | tojson }}",
        &messages,
        &ChatOptions::default(),
    )
    .unwrap();
    // Tool-call arguments keep their key order through `tojson`, as in Python.
    assert_eq!(text, r#"hi|f|{"z": 1, "a": "é"}"#);
}

const TAGGED: &str = "{% for m in messages %}\n<{{ m.role }}>\n{% if m.role == 'assistant' %}\n{%- generation -%}\n  {{ m.content }}</s>\n{%- endgeneration %}\n{% else %}{{ m.content }}{% endif %}\n\n{% endfor %}";

#[test]
fn generation_tags_render_like_plain_text_and_mark_the_block() {
    let tagged = template(TAGGED);
    let plain = template(
        &TAGGED
            .replace("{%- generation -%}", "{%- if true -%}")
            .replace("{%- endgeneration %}", "{%- endif %}"),
    );
    let rendered = tagged
        .render(&conversation(), &ChatOptions::default())
        .unwrap();
    assert_eq!(
        rendered.text,
        plain
            .render_text(&conversation(), &ChatOptions::default())
            .unwrap()
    );
    assert_eq!(rendered.assistant_spans.len(), 1);
    assert_eq!(
        &rendered.text[rendered.assistant_spans[0].clone()],
        "Hello!</s>"
    );
}

#[test]
fn mask_marks_exactly_the_assistant_tokens_with_a_real_tokenizer() {
    let tokenizer = qwen2();
    let template = tokenizer.chat_template().unwrap();
    let messages = vec![
        ChatMessage::user("Hi"),
        ChatMessage::assistant("Olé 🦀"),
        ChatMessage::user("Bye"),
    ];
    let encoding = template
        .encode(&tokenizer, &messages, &ChatOptions::default())
        .unwrap();
    assert_eq!(encoding.ids.len(), encoding.assistant_mask.len());
    let marked: Vec<u32> = encoding
        .ids
        .iter()
        .zip(&encoding.assistant_mask)
        .filter(|(_, m)| **m)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(
        tokenizer.decode(&marked, false).unwrap(),
        "Olé 🦀<|im_end|>"
    );
}

#[test]
fn prefix_mask_needs_prefix_stable_templates() {
    // The output depends on the number of messages, so earlier renderings are not prefixes.
    let source = "{{ messages|length }}{% for m in messages %}{{ m.content }}{% endfor %}";
    let err = template(source)
        .render(&conversation(), &ChatOptions::default())
        .unwrap_err();
    assert!(
        matches!(&err, TokenizerError::AssistantMask { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("generation"), "{err}");
}

#[test]
fn messages_with_span_markers_are_rejected() {
    let err = template(TAGGED)
        .render(&[ChatMessage::user("x\u{FDD0}")], &ChatOptions::default())
        .unwrap_err();
    assert!(err.to_string().contains("U+FDD0"), "{err}");
}

#[test]
fn empty_conversation_is_an_error_as_in_transformers() {
    let err = render("x", &[], &ChatOptions::default()).unwrap_err();
    assert!(err.to_string().contains("empty conversation"), "{err}");
}
