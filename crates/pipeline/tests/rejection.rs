//! Rejection sampling on the tiny qwen2 fixture (model + tokenizer with a chat template) with a
//! scripted verifier: only completions it calls correct are kept, repeats are dropped, the
//! per-task cap holds, the counts add up, and the written JSONL reads back through `stoke
//! train`'s chat source as one conversation per kept completion.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use candle_core::Device;
use stoke_model::Transformer;
use stoke_pipeline::Task;
use stoke_pipeline::rejection::{RejectionSettings, sample_and_filter, write_chat_jsonl};
use stoke_pipeline::reward::{RewardPool, RewardSpec};
use stoke_pipeline::task::chat_task;
use stoke_reward::{Details, Reference, RewardInput, RewardOutcome, Verifier};
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::source::{BatchSource, ChatSource, ChatSourceConfig};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

/// (The fixture model is random and its completions mostly hit `max_new_tokens`, so most tests
/// keep truncated completions to have something to keep.)
///
/// Correct exactly when the completion's text has an even number of bytes (about half of the
/// random model's completions), so both branches of the filter are exercised.
struct EvenLength;

impl Verifier for EvenLength {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        if input.completion.len().is_multiple_of(2) {
            RewardOutcome::correct(Details::default())
        } else {
            RewardOutcome::wrong(Details::default())
        }
    }
}

fn setup(tasks: usize) -> (Transformer, Tokenizer, Vec<Arc<Task>>, RewardPool) {
    let model = Transformer::load(&fixture_dir(), &Device::Cpu).expect("fixture model loads");
    let tokenizer = Tokenizer::from_dir(&fixture_dir()).expect("fixture tokenizer loads");
    let tasks = (0..tasks)
        .map(|i| {
            chat_task(
                format!("t{i}"),
                &format!("Question {i}: say something"),
                Reference::default(),
                &tokenizer,
            )
            .map(Arc::new)
            .expect("task renders")
        })
        .collect();
    let spec = RewardSpec {
        name: "even".into(),
        verifier: Arc::new(EvenLength),
        group_level: false,
        dense_process: false,
    };
    let pool = RewardPool::new(vec![spec], 2, Duration::from_secs(30)).expect("pool starts");
    (model, tokenizer, tasks, pool)
}

fn settings(keep_per_prompt: usize, keep_truncated: bool) -> RejectionSettings {
    RejectionSettings {
        samples_per_prompt: 6,
        keep_per_prompt,
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 6,
        seed: 3,
        keep_truncated,
        verify: true,
    }
}

#[test]
fn keeps_only_distinct_verified_completions_within_the_cap() {
    let (model, tokenizer, tasks, pool) = setup(5);
    let mut calls = 0;
    let result = sample_and_filter(
        &model,
        &tokenizer,
        &tasks,
        &pool,
        &settings(2, true),
        &mut |_| calls += 1,
    )
    .unwrap();
    let report = &result.report;
    assert_eq!(calls, 1, "five tasks fit one engine call");
    assert_eq!(report.prompts, 5);
    assert_eq!(report.samples, 30);
    assert_eq!(report.kept, result.kept.len());
    assert!(
        report.kept > 0 && report.correct > report.kept,
        "{report:?}"
    );
    assert_eq!(
        report.correct,
        report.kept + report.duplicates + report.truncated + report.over_cap
    );
    assert_eq!(report.prompts_with_other_context, 0);
    for task in &tasks {
        let texts: Vec<&str> = result
            .kept
            .iter()
            .filter(|k| k.task_id == task.id)
            .map(|k| k.completion.as_str())
            .collect();
        assert!(texts.len() <= 2, "cap of 2 exceeded for {}", task.id);
        assert!(texts.iter().all(|t| t.len() % 2 == 0), "kept a wrong one");
        let mut distinct = texts.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), texts.len(), "a repeat was kept");
    }
    assert_eq!(report.truncated, 0, "keep_truncated keeps them");

    // Without keep_truncated the same samples are drawn and the truncated correct ones go.
    let strict = sample_and_filter(
        &model,
        &tokenizer,
        &tasks,
        &pool,
        &settings(2, false),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(strict.report.correct, report.correct);
    assert!(strict.report.kept <= report.kept);
    assert_eq!(
        strict.report.correct,
        strict.report.kept
            + strict.report.duplicates
            + strict.report.truncated
            + strict.report.over_cap
    );
    let with_kept = tasks
        .iter()
        .filter(|t| result.kept.iter().any(|k| k.task_id == t.id))
        .count();
    assert_eq!(report.prompts_with_kept, with_kept);
}

#[test]
fn the_kept_set_grows_with_the_cap_and_the_same_seed_repeats_it() {
    let (model, tokenizer, tasks, pool) = setup(4);
    let narrow = sample_and_filter(
        &model,
        &tokenizer,
        &tasks,
        &pool,
        &settings(1, true),
        &mut |_| {},
    )
    .unwrap();
    let wide = sample_and_filter(
        &model,
        &tokenizer,
        &tasks,
        &pool,
        &settings(6, true),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(narrow.report.correct, wide.report.correct);
    assert!(narrow.report.kept <= 4);
    assert!(wide.report.kept > narrow.report.kept, "{:?}", wide.report);
    assert_eq!(wide.report.over_cap, 0);
    // With the cap at 1, the kept completion of a task is its first kept one under a wider cap.
    for kept in &narrow.kept {
        let first = wide
            .kept
            .iter()
            .find(|k| k.task_id == kept.task_id)
            .unwrap();
        assert_eq!(first, kept);
    }
}

#[test]
fn the_written_jsonl_reads_back_as_sft_conversations() {
    let (model, tokenizer, tasks, pool) = setup(4);
    let result = sample_and_filter(
        &model,
        &tokenizer,
        &tasks,
        &pool,
        &settings(3, true),
        &mut |_| {},
    )
    .unwrap();
    assert!(!result.kept.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rft.jsonl");
    write_chat_jsonl(&path, &result.kept).unwrap();
    assert!(!dir.path().join("rft.jsonl.tmp").exists());
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), result.kept.len());

    // The Qwen template adds a default system prompt: about 110 tokens per conversation.
    let mut source = ChatSource::open(&path, &tokenizer, ChatSourceConfig::new(192, 2, 0)).unwrap();
    assert_eq!(source.num_conversations(), result.kept.len());
    assert!(source.skipped().is_empty(), "{:?}", source.skipped());
    let batch = source.next_batch().unwrap();
    assert!(batch.is_some());
    // The user turn of each line is the task's prompt.
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let task = tasks
        .iter()
        .find(|t| t.id == first["task_id"].as_str().unwrap())
        .unwrap();
    assert_eq!(first["messages"][0]["content"], task.prompt.as_str());
}

#[test]
fn a_task_with_a_system_message_is_counted_as_other_context() {
    let (model, tokenizer, mut tasks, pool) = setup(2);
    let options = stoke_tokenizer::chat::ChatOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let messages = [
        stoke_tokenizer::chat::ChatMessage::system("Answer briefly."),
        stoke_tokenizer::chat::ChatMessage::user(tasks[1].prompt.as_str()),
    ];
    let prompt_ids = tokenizer
        .apply_chat_template(&messages, &options)
        .unwrap()
        .ids;
    assert_ne!(prompt_ids, tasks[1].prompt_ids);
    tasks[1] = Arc::new(Task {
        prompt_ids,
        ..(*tasks[1]).clone()
    });
    let result = sample_and_filter(
        &model,
        &tokenizer,
        &tasks,
        &pool,
        &settings(2, true),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(result.report.prompts_with_other_context, 1);
}

/// The same samples as preference pairs: each pairs a kept correct completion with a distinct
/// wrong one of the same task, and the written file reads back through `stoke dpo`'s reader with
/// exactly the sampled token ids.
#[test]
fn verified_pairs_put_a_correct_sample_against_a_wrong_one_in_token_space() {
    use stoke_pipeline::rejection::write_pairs_jsonl;
    use stoke_train::preference::data::{ReadOptions, read_pairs};
    let (model, tokenizer, tasks, pool) = setup(5);
    let result = sample_and_filter(
        &model,
        &tokenizer,
        &tasks,
        &pool,
        &settings(2, true),
        &mut |_| {},
    )
    .unwrap();
    assert!(
        !result.pairs.is_empty(),
        "no task had both a correct and a wrong sample"
    );
    for pair in &result.pairs {
        assert!(
            pair.chosen.len().is_multiple_of(2),
            "chosen is not verified correct"
        );
        assert!(
            !pair.rejected.len().is_multiple_of(2),
            "rejected is correct"
        );
        assert!(
            result
                .kept
                .iter()
                .any(|k| k.task_id == pair.task_id && k.completion == pair.chosen),
            "chosen is not one of the kept completions"
        );
        let task = tasks.iter().find(|t| t.id == pair.task_id).unwrap();
        assert_eq!(pair.prompt_ids, task.prompt_ids);
        assert!(!pair.chosen_ids.is_empty() && !pair.rejected_ids.is_empty());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pairs.jsonl");
    write_pairs_jsonl(&path, &result.pairs).unwrap();
    let options = ReadOptions {
        max_len: 128,
        strict: true,
    };
    let (read, report) = read_pairs(&path, &tokenizer, options).unwrap();
    assert_eq!(report.examples, result.pairs.len());
    for (got, want) in read.iter().zip(&result.pairs) {
        assert_eq!(got.prompt_ids, want.prompt_ids);
        assert_eq!(got.chosen_ids, want.chosen_ids);
        assert_eq!(got.rejected_ids, want.rejected_ids);
    }
}
