//! Rendering environment turns as ids, on the tiny qwen2 fixture's tokenizer and its Qwen2.5
//! chat template: the segment that follows a model turn, the template behaviours refused by
//! name, and render errors that name the message.

use std::path::PathBuf;

use stoke_env::{EnvError, ToolSpec, TurnRenderer};
use stoke_tokenizer::chat::{ChatMessage, Role, TemplateValue};
use stoke_tokenizer::hf::Tokenizer;

fn tokenizer() -> Tokenizer {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied");
    Tokenizer::from_dir(&dir).expect("fixture tokenizer loads")
}

fn tool(content: &str) -> ChatMessage {
    let mut message = ChatMessage::new(Role::Tool, content);
    message
        .extra
        .insert("tool_call_id".into(), TemplateValue::from("call-0"));
    message
}

fn history() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("s"),
        ChatMessage::user("What is 2 + 2?"),
        ChatMessage::assistant(
            "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2 + 2\"}}\n</tool_call>",
        ),
    ]
}

#[test]
fn the_segment_after_a_model_turn_resumes_after_its_end_of_turn_token() {
    let tokenizer = tokenizer();
    let template = tokenizer.default_chat_template().unwrap();
    let renderer = TurnRenderer::new(&tokenizer, template, &[]).unwrap();
    assert_eq!(renderer.turn_closer(), Some("<|im_end|>"));
    let text = renderer
        .continuation_text(&history(), &[tool("4")])
        .unwrap();
    // Qwen2.5 renders tool results as a user turn of <tool_response> blocks.
    assert_eq!(
        text,
        "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = renderer.continuation_ids(&history(), &[tool("4")]).unwrap();
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
}

#[test]
fn tools_reach_the_template_and_the_segment_is_unchanged_by_them() {
    let tokenizer = tokenizer();
    let template = tokenizer.default_chat_template().unwrap();
    let spec = ToolSpec {
        name: "calculator".into(),
        description: "Exact arithmetic.".into(),
        parameters: serde_json::json!({"type": "object", "properties": {"expression": {"type": "string"}}}),
    };
    let with_tools = TurnRenderer::new(&tokenizer, template, std::slice::from_ref(&spec)).unwrap();
    let prompt = with_tools.prompt_ids(&history()[..2]).unwrap();
    let text = tokenizer.decode(&prompt, false).unwrap();
    assert!(
        text.contains("<tools>") && text.contains("\"calculator\""),
        "{text}"
    );
    let plain = TurnRenderer::new(&tokenizer, template, &[]).unwrap();
    assert_eq!(
        with_tools
            .continuation_text(&history(), &[tool("4")])
            .unwrap(),
        plain.continuation_text(&history(), &[tool("4")]).unwrap()
    );
}

#[test]
fn a_template_that_rewrites_earlier_turns_is_refused_by_name() {
    let tokenizer = tokenizer();
    // Drops every assistant turn's content once a later message follows it.
    let source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}[hidden]{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let template = tokenizer
        .chat_template_from_source("rewriter", source)
        .unwrap();
    let renderer = TurnRenderer::new(&tokenizer, &template, &[]).unwrap();
    let error = renderer
        .continuation_ids(&history(), &[tool("4")])
        .unwrap_err();
    match error {
        EnvError::UnsupportedTemplate {
            template,
            behaviour,
            ..
        } => {
            assert_eq!(template, "rewriter");
            assert_eq!(
                behaviour,
                "rewriting earlier turns when new messages follow"
            );
        }
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn a_message_the_template_cannot_render_is_named_by_index_and_role() {
    let tokenizer = tokenizer();
    let source = "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('tool messages are not supported') }}{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let template = tokenizer
        .chat_template_from_source("no-tools", source)
        .unwrap();
    let renderer = TurnRenderer::new(&tokenizer, &template, &[]).unwrap();
    let error = renderer
        .continuation_ids(&history(), &[tool("4")])
        .unwrap_err();
    match &error {
        EnvError::Render {
            index,
            role,
            message,
        } => {
            assert_eq!((*index, role.as_str()), (3, "tool"));
            assert!(
                message.contains("tool messages are not supported"),
                "{message}"
            );
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(error.to_string().starts_with("messages[3] (role tool):"));
}
