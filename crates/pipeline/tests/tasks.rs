//! JSONL task files: prompts and conversations rendered with the chat template, reference fields,
//! reward names, and bad lines skipped with their line numbers.

use std::path::{Path, PathBuf};

use stoke_pipeline::PipelineError;
use stoke_pipeline::task::{chat_task, load_tasks};
use stoke_reward::Reference;
use stoke_tokenizer::chat::{ChatMessage, ChatOptions};
use stoke_tokenizer::hf::Tokenizer;
use stoke_tokenizer::train::{TrainerConfig, WordCounts, train_bpe};

const TEMPLATE: &str = r"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A small BPE with ChatML special tokens; with or without a chat template.
fn tokenizer(dir: &Path, with_template: bool) -> Tokenizer {
    let texts: Vec<String> = (0..50)
        .map(|i| format!("What is {i} plus {}? The answer is {}.", i + 1, 2 * i + 1))
        .collect();
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from);
    let config = TrainerConfig::new(300, specials.to_vec());
    let mut words = WordCounts::new(&config.pattern).unwrap();
    words.add_texts(&texts);
    train_bpe(&words, &config, |_| {})
        .unwrap()
        .save(dir)
        .unwrap();
    let mut tokenizer_config = serde_json::json!({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
    });
    if with_template {
        tokenizer_config["chat_template"] = TEMPLATE.into();
    }
    std::fs::write(
        dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
    Tokenizer::from_dir(dir).unwrap()
}

fn names() -> Vec<String> {
    vec!["default".to_string(), "math".to_string()]
}

fn write_tasks(dir: &Path, lines: &[&str]) -> PathBuf {
    let path = dir.join("tasks.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn generation_prompt(tokenizer: &Tokenizer, messages: &[ChatMessage]) -> Vec<u32> {
    let options = ChatOptions {
        add_generation_prompt: true,
        ..ChatOptions::default()
    };
    tokenizer
        .apply_chat_template(messages, &options)
        .unwrap()
        .ids
}

#[test]
fn prompt_lines_become_chat_rendered_tasks_with_references() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), true);
    let path = write_tasks(
        dir.path(),
        &[
            r#"{"id": "q1", "prompt": "What is 2 plus 3?", "answer": "5"}"#,
            r#"{"prompt": "What is 4 plus 4?", "answer": 8, "reward": "math", "source": "x"}"#,
        ],
    );
    let load = load_tasks(&path, &tok, &names()).unwrap();
    assert!(load.skipped.is_empty(), "{:?}", load.skipped);
    assert_eq!(load.tasks.len(), 2);
    let first = &load.tasks[0];
    assert_eq!(first.id, "q1");
    assert_eq!(first.prompt, "What is 2 plus 3?");
    assert_eq!(first.reference.answer.as_deref(), Some("5"));
    assert_eq!(first.reward, 0);
    assert_eq!(
        first.prompt_ids,
        generation_prompt(&tok, &[ChatMessage::user("What is 2 plus 3?")])
    );
    let second = &load.tasks[1];
    assert_eq!(second.id, "tasks.jsonl:2");
    assert_eq!(second.reference.answer.as_deref(), Some("8"));
    assert_eq!(second.reward, 1);
}

#[test]
fn messages_are_rendered_and_the_last_user_turn_is_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), true);
    let path = write_tasks(
        dir.path(),
        &[
            r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 plus 2?"}], "answer": "3"}"#,
        ],
    );
    let load = load_tasks(&path, &tok, &names()).unwrap();
    let task = &load.tasks[0];
    assert_eq!(task.prompt, "What is 1 plus 2?");
    let expected = generation_prompt(
        &tok,
        &[
            ChatMessage::system("Be brief."),
            ChatMessage::user("What is 1 plus 2?"),
        ],
    );
    assert_eq!(task.prompt_ids, expected);
}

#[test]
fn without_a_chat_template_a_prompt_is_tokenized_raw() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let path = write_tasks(
        dir.path(),
        &[
            r#"{"prompt": "What is 2 plus 3?"}"#,
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
        ],
    );
    let load = load_tasks(&path, &tok, &names()).unwrap();
    assert_eq!(load.tasks.len(), 1);
    assert_eq!(
        load.tasks[0].prompt_ids,
        tok.encode("What is 2 plus 3?", true).unwrap()
    );
    assert_eq!(load.skipped.len(), 1);
    assert_eq!(load.skipped[0].0, 2);
    assert!(load.skipped[0].1.contains("chat template"));
}

#[test]
fn bad_lines_are_skipped_with_their_line_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), true);
    let path = write_tasks(
        dir.path(),
        &[
            r#"{"prompt": "What is 2 plus 3?", "answer": "5"}"#,
            r#"{"prompt": "broken"#,
            "",
            r#"[1, 2]"#,
            r#"{"answer": "4"}"#,
            r#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
            r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}"#,
            r#"{"prompt": "p", "cases": "not a list"}"#,
            r#"{"prompt": "p", "messages": []}"#,
            r#"{"prompt": "What is 1 plus 1?", "answer": "2"}"#,
        ],
    );
    let load = load_tasks(&path, &tok, &names()).unwrap();
    assert_eq!(load.tasks.len(), 2);
    assert_eq!(load.lines, 10);
    let lines: Vec<usize> = load.skipped.iter().map(|(line, _)| *line).collect();
    assert_eq!(lines, [2, 3, 4, 5, 6, 7, 8, 9]);
    let why = |line: usize| {
        load.skipped
            .iter()
            .find(|(l, _)| *l == line)
            .map(|(_, why)| why.clone())
            .unwrap()
    };
    assert!(why(2).contains("invalid JSON"), "{}", why(2));
    assert!(why(3).contains("blank"), "{}", why(3));
    assert!(why(4).contains("not a JSON object"), "{}", why(4));
    assert!(why(5).contains("no `prompt`"), "{}", why(5));
    assert!(why(6).contains("messages[0]"), "{}", why(6));
    assert!(why(7).contains("assistant"), "{}", why(7));
    assert!(why(8).contains("reference"), "{}", why(8));
    assert!(why(9).contains("not both"), "{}", why(9));
    let summary = load.summary(&path);
    assert!(summary.contains("tasks.jsonl:2:"), "{summary}");
}

#[test]
fn unknown_reward_name_is_an_error_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), true);
    let path = write_tasks(
        dir.path(),
        &[
            r#"{"prompt": "What is 2 plus 3?"}"#,
            r#"{"prompt": "What is 2 plus 3?", "reward": "code"}"#,
        ],
    );
    match load_tasks(&path, &tok, &names()) {
        Err(PipelineError::Task { file, line, reason }) => {
            assert_eq!(file, path);
            assert_eq!(line, 2);
            assert!(reason.contains("`code`"), "{reason}");
        }
        other => panic!("expected a task error, got {other:?}"),
    }
}

#[test]
fn a_file_without_usable_lines_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), true);
    let path = write_tasks(dir.path(), &["not json", "{}"]);
    match load_tasks(&path, &tok, &names()) {
        Err(PipelineError::Task { line, reason, .. }) => {
            assert_eq!(line, 1);
            assert!(reason.contains("no usable task"), "{reason}");
        }
        other => panic!("expected a task error, got {other:?}"),
    }
}

#[test]
fn chat_task_renders_one_user_message() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), true);
    let reference = Reference {
        answer: Some("7".into()),
        ..Reference::default()
    };
    let task = chat_task("a-1".into(), "What is 3 plus 4?", reference.clone(), &tok).unwrap();
    assert_eq!(task.prompt, "What is 3 plus 4?");
    assert_eq!(task.reference, reference);
    assert_eq!(task.reward, 0);
    assert_eq!(
        task.prompt_ids,
        generation_prompt(&tok, &[ChatMessage::user("What is 3 plus 4?")])
    );
}
