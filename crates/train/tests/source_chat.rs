//! ChatSource over chat JSONL with the Qwen2.5 chat template (fixtures/tokenizers/qwen2):
//! assistant-only loss masks, document-masked packing, truncation, exact resume, bad-line reports.

use std::path::{Path, PathBuf};

use serde_json::json;
use stoke_data::packing::{PAD_DOC, PackedBatch, PackingPolicy};
use stoke_tokenizer::chat::{ChatMessage, ChatOptions};
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::source::{BatchSource, ChatSource, ChatSourceConfig, SkipReason, SourceError};

fn qwen2() -> Tokenizer {
    Tokenizer::from_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizers/qwen2"),
    )
    .unwrap()
}

/// Conversation `k`: digits-only system/user turns, letters-only assistant turns, 1-3 exchanges,
/// lengths varying with `k`.
fn conversation(k: usize) -> Vec<(&'static str, String)> {
    let words = ["alpha", "beta", "gamma", "delta", "omega"];
    let mut turns = Vec::new();
    if k.is_multiple_of(3) {
        turns.push(("system", format!("{}", 1000 + k)));
    }
    for t in 0..1 + k % 3 {
        turns.push((
            "user",
            format!("{} {}", k * 7 + t, "42 ".repeat(k % 5).trim_end()),
        ));
        let answer: Vec<&str> = (0..1 + (k + t) % 6).map(|i| words[(k + i) % 5]).collect();
        turns.push(("assistant", answer.join(" ")));
    }
    turns
}

fn line(turns: &[(&str, String)]) -> String {
    let messages: Vec<_> = turns
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"id": "extra fields are ignored", "messages": messages}).to_string()
}

fn messages(turns: &[(&str, String)]) -> Vec<ChatMessage> {
    turns
        .iter()
        .map(|(role, content)| match *role {
            "system" => ChatMessage::system(content.clone()),
            "user" => ChatMessage::user(content.clone()),
            _ => ChatMessage::assistant(content.clone()),
        })
        .collect()
}

fn write_jsonl(dir: &Path, lines: &[String]) -> PathBuf {
    let path = dir.join("chat.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn sample(dir: &Path, n: usize) -> (PathBuf, Vec<Vec<(&'static str, String)>>) {
    let conversations: Vec<_> = (0..n).map(conversation).collect();
    let lines: Vec<String> = conversations.iter().map(|c| line(c)).collect();
    (write_jsonl(dir, &lines), conversations)
}

fn config(max_epochs: Option<u64>) -> ChatSourceConfig {
    ChatSourceConfig {
        max_epochs,
        policy: PackingPolicy::BestFitDecreasing { window_docs: 8 },
        ..ChatSourceConfig::new(512, 3, 11)
    }
}

fn all_batches(source: &mut ChatSource) -> Vec<PackedBatch> {
    std::iter::from_fn(|| source.next_batch().unwrap()).collect()
}

fn take(source: &mut ChatSource, n: usize) -> Vec<PackedBatch> {
    (0..n).map_while(|_| source.next_batch().unwrap()).collect()
}

/// Positions of row `row` belonging to piece `piece`.
fn piece_positions(batch: &PackedBatch, row: usize, piece: usize) -> Vec<usize> {
    (row * batch.seq_len..(row + 1) * batch.seq_len)
        .filter(|&i| batch.doc_ids[i] == piece as u32)
        .collect()
}

#[test]
fn loss_mask_covers_exactly_the_assistant_turns() {
    let dir = tempfile::tempdir().unwrap();
    let (path, conversations) = sample(dir.path(), 30);
    let tokenizer = qwen2();
    let mut source = ChatSource::open(&path, &tokenizer, config(Some(1))).unwrap();
    let mut checked = 0;
    for batch in all_batches(&mut source) {
        for (r, row) in batch.rows.iter().enumerate() {
            for (p, piece) in row.pieces.iter().enumerate() {
                let trained: Vec<u32> = piece_positions(&batch, r, p)
                    .into_iter()
                    .filter(|&i| batch.loss_mask[i])
                    .map(|i| batch.targets[i])
                    .collect();
                let expected: String = conversations[piece.doc as usize]
                    .iter()
                    .filter(|(role, _)| *role == "assistant")
                    .map(|(_, content)| format!("{content}<|im_end|>"))
                    .collect();
                assert_eq!(tokenizer.decode(&trained, false).unwrap(), expected);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 30, "every conversation checked once");
}

/// Under every policy, including those that cut conversations across rows (pieces starting
/// mid-conversation), only assistant tokens are targets, and each cut loses at most one.
#[test]
fn system_and_user_tokens_are_never_targets() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = sample(dir.path(), 30);
    let tokenizer = qwen2();
    let im_start = tokenizer.token_to_id("<|im_start|>").unwrap();
    for policy in [
        PackingPolicy::BestFitDecreasing { window_docs: 8 },
        PackingPolicy::BestFitDecreasingSplit { window_docs: 8 },
        PackingPolicy::ConcatChunk,
    ] {
        let mut source = ChatSource::open(
            &path,
            &tokenizer,
            ChatSourceConfig {
                policy,
                ..config(Some(1))
            },
        )
        .unwrap();
        let mut trained = 0u64;
        let mut cut_pieces = 0u64;
        for batch in all_batches(&mut source) {
            cut_pieces += batch
                .rows
                .iter()
                .flat_map(|r| &r.pieces)
                .filter(|p| p.start > 0)
                .count() as u64;
            for i in (0..batch.tokens.len()).filter(|&i| batch.loss_mask[i]) {
                trained += 1;
                let target = tokenizer.decode(&[batch.targets[i]], false).unwrap();
                // System and user contents are digits only; assistant contents letters and spaces.
                assert!(
                    !target.chars().any(|c| c.is_ascii_digit()),
                    "{policy:?}: trained target {target:?}"
                );
                assert_ne!(
                    batch.targets[i], im_start,
                    "{policy:?}: a role header was trained"
                );
            }
        }
        let per_epoch = source.report().trained_tokens;
        assert!(
            trained <= per_epoch && trained + cut_pieces >= per_epoch,
            "{policy:?}: {trained} of {per_epoch}, {cut_pieces} cuts"
        );
        if !matches!(policy, PackingPolicy::BestFitDecreasing { .. }) {
            assert!(
                cut_pieces > 0,
                "{policy:?} should cut some conversation in this sample"
            );
        }
    }
}

#[test]
fn every_assistant_target_is_trained_once_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = sample(dir.path(), 25);
    let mut source = ChatSource::open(&path, &qwen2(), config(Some(2))).unwrap();
    let per_epoch = source.report().trained_tokens;
    assert!(per_epoch > 0);
    let trained: u64 = all_batches(&mut source)
        .iter()
        .map(|b| b.num_loss_tokens() as u64)
        .sum();
    assert_eq!(trained, 2 * per_epoch);
}

#[test]
fn packed_rows_hold_whole_conversations_with_their_own_doc_ids_and_positions() {
    let dir = tempfile::tempdir().unwrap();
    let (path, conversations) = sample(dir.path(), 30);
    let tokenizer = qwen2();
    let mut source = ChatSource::open(&path, &tokenizer, config(Some(1))).unwrap();
    let mut multi_conversation_rows = 0;
    for batch in all_batches(&mut source) {
        for (r, row) in batch.rows.iter().enumerate() {
            let docs: std::collections::BTreeSet<u64> = row.pieces.iter().map(|p| p.doc).collect();
            assert_eq!(
                docs.len(),
                row.pieces.len(),
                "a conversation twice in one row"
            );
            if row.pieces.len() > 1 {
                multi_conversation_rows += 1;
            }
            let mut next_start = r * batch.seq_len;
            for (p, piece) in row.pieces.iter().enumerate() {
                let positions = piece_positions(&batch, r, p);
                // Contiguous, in piece order, positions restarting at 0.
                assert_eq!(positions.first(), Some(&next_start));
                assert!(positions.windows(2).all(|w| w[1] == w[0] + 1));
                let ids: Vec<u32> = positions.iter().map(|&i| batch.position_ids[i]).collect();
                assert_eq!(ids, (0..positions.len() as u32).collect::<Vec<_>>());
                next_start += positions.len();
                // The piece is the whole rendered conversation.
                let rendered = tokenizer
                    .apply_chat_template(
                        &messages(&conversations[piece.doc as usize]),
                        &ChatOptions::default(),
                    )
                    .unwrap();
                assert_eq!(piece.start, 0);
                assert_eq!(piece.len as usize, rendered.ids.len());
                let mut tokens: Vec<u32> = positions.iter().map(|&i| batch.tokens[i]).collect();
                if let Some(&last) = positions.last() {
                    if tokens.len() < rendered.ids.len() {
                        tokens.push(batch.targets[last]);
                    }
                    // The last input of a conversation predicts the next one's first token.
                    assert!(!batch.loss_mask[last]);
                }
                assert_eq!(tokens, rendered.ids);
            }
            for i in next_start..(r + 1) * batch.seq_len {
                assert_eq!(batch.doc_ids[i], PAD_DOC);
                assert!(!batch.loss_mask[i]);
            }
        }
    }
    assert!(
        multi_conversation_rows > 0,
        "the sample should pack several per row"
    );
}

#[test]
fn long_conversation_is_truncated_to_one_row_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let long = vec![("user", "7".repeat(20)), ("assistant", "beta ".repeat(200))];
    let lines = vec![line(&conversation(1)), line(&long), line(&conversation(2))];
    let path = write_jsonl(dir.path(), &lines);
    let tokenizer = qwen2();
    let rendered = tokenizer
        .apply_chat_template(&messages(&long), &ChatOptions::default())
        .unwrap();
    let seq_len = 256;
    assert!(rendered.ids.len() > seq_len + 1);
    let config = ChatSourceConfig {
        shuffle: false,
        max_epochs: Some(1),
        ..ChatSourceConfig::new(seq_len, 4, 0)
    };
    let mut source = ChatSource::open(&path, &tokenizer, config).unwrap();
    let report = source.report().clone();
    assert_eq!(report.truncated_lines, vec![2]);
    assert_eq!(
        report.truncated_tokens as usize,
        rendered.ids.len() - (seq_len + 1)
    );
    let batch = source.next_batch().unwrap().unwrap();
    let row = batch
        .rows
        .iter()
        .position(|row| row.pieces.iter().any(|p| p.doc == 1))
        .unwrap();
    assert_eq!(
        batch.rows[row].pieces.len(),
        1,
        "a full row holds only the long one"
    );
    let at = row * seq_len;
    assert_eq!(&batch.tokens[at..at + seq_len], &rendered.ids[..seq_len]);
    assert_eq!(batch.targets[at + seq_len - 1], rendered.ids[seq_len]);
}

#[test]
fn restored_cursor_yields_the_same_following_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = sample(dir.path(), 20);
    let tokenizer = qwen2();
    let mut uninterrupted = ChatSource::open(&path, &tokenizer, config(None)).unwrap();
    take(&mut uninterrupted, 4);
    let cursor_text = serde_json::to_string(&uninterrupted.cursor()).unwrap();
    let expected = take(&mut uninterrupted, 25);
    assert!(
        uninterrupted.chat_cursor().epoch >= 2,
        "the continuation crosses epochs"
    );

    let mut resumed = ChatSource::open(&path, &tokenizer, config(None)).unwrap();
    take(&mut resumed, 1);
    resumed
        .restore(serde_json::from_str(&cursor_text).unwrap())
        .unwrap();
    assert_eq!(take(&mut resumed, 25), expected);
}

#[test]
fn same_seed_same_order_other_seed_other_order() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = sample(dir.path(), 30);
    let tokenizer = qwen2();
    let first = |seed| {
        let mut s = ChatSource::open(
            &path,
            &tokenizer,
            ChatSourceConfig {
                seed,
                ..config(None)
            },
        )
        .unwrap();
        take(&mut s, 3)
    };
    assert_eq!(first(1), first(1));
    assert_ne!(first(1), first(2));
}

#[test]
fn cursor_from_other_data_or_settings_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = qwen2();
    let (path_a, _) = sample(&dir.path().join("a").tap_mkdir(), 20);
    let (path_b, _) = sample(&dir.path().join("b").tap_mkdir(), 21);
    let mut a = ChatSource::open(&path_a, &tokenizer, config(None)).unwrap();
    take(&mut a, 2);
    let mut b = ChatSource::open(&path_b, &tokenizer, config(None)).unwrap();
    let err = b.restore(a.cursor()).unwrap_err();
    assert!(matches!(err, SourceError::CursorMismatch { .. }), "{err}");

    let mut other_seq_len = ChatSource::open(
        &path_a,
        &tokenizer,
        ChatSourceConfig {
            seq_len: 200,
            ..config(None)
        },
    )
    .unwrap();
    let err = other_seq_len.restore(a.cursor()).unwrap_err();
    assert!(matches!(err, SourceError::CursorMismatch { .. }), "{err}");

    let err = b.restore(json!({"epoch": 0})).unwrap_err();
    assert!(matches!(err, SourceError::BadCursor { .. }), "{err}");
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}
impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

#[test]
fn bad_lines_are_reported_with_their_line_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let good = line(&conversation(1));
    let lines = vec![
        good.clone(),                                                            // 1
        "{not json".to_string(),                                                 // 2
        json!({"conversation": []}).to_string(),                                 // 3
        json!({"messages": [{"role": "narrator", "content": "x"}]}).to_string(), // 4
        json!({"messages": []}).to_string(),                                     // 5
        String::new(),                                                           // 6
        json!({"messages": [{"role": "user", "content": "hi"}]}).to_string(),    // 7
        json!({"messages": "hello"}).to_string(),                                // 8
        json!([1, 2]).to_string(),                                               // 9
        json!({"messages": [{"content": "no role"}]}).to_string(),               // 10
        good,                                                                    // 11
    ];
    let path = write_jsonl(dir.path(), &lines);
    let source = ChatSource::open(&path, &qwen2(), config(None)).unwrap();
    let skipped: Vec<(usize, SkipReason)> = source
        .skipped()
        .iter()
        .map(|s| (s.line, s.reason.clone()))
        .collect();
    let lines_and_kinds: Vec<(usize, &str)> = skipped
        .iter()
        .map(|(line, reason)| {
            let kind = match reason {
                SkipReason::InvalidJson(_) => "json",
                SkipReason::MissingMessages => "missing",
                SkipReason::UnknownRole { message: 0, role } if role == "\"narrator\"" => "role",
                SkipReason::EmptyConversation => "empty",
                SkipReason::BlankLine => "blank",
                SkipReason::NoAssistantTurn => "no-assistant",
                SkipReason::MessagesNotAList => "not-list",
                SkipReason::NotAnObject => "not-object",
                SkipReason::BadMessage(_) => "bad-message",
                other => panic!("unexpected reason {other:?}"),
            };
            (*line, kind)
        })
        .collect();
    assert_eq!(
        lines_and_kinds,
        vec![
            (2, "json"),
            (3, "missing"),
            (4, "role"),
            (5, "empty"),
            (6, "blank"),
            (7, "no-assistant"),
            (8, "not-list"),
            (9, "not-object"),
            (10, "bad-message"),
        ]
    );
    assert_eq!(source.num_conversations(), 2);
    assert_eq!(source.report().lines, 11);
    let shown = source.skipped()[0].to_string();
    assert!(
        shown.starts_with(&format!("{}:2: invalid JSON", path.display())),
        "{shown}"
    );
}

#[test]
fn file_with_no_usable_line_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_jsonl(dir.path(), &["{oops".to_string(), "[]".to_string()]);
    let err = ChatSource::open(&path, &qwen2(), config(None)).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            SourceError::NoConversations {
                lines: 2,
                skipped: 2,
                ..
            }
        ),
        "{text}"
    );
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("line 1: invalid JSON"), "{text}");
}

#[test]
fn missing_file_is_an_error_naming_it() {
    let err =
        ChatSource::open(Path::new("/nonexistent/chat.jsonl"), &qwen2(), config(None)).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/chat.jsonl"), "{err}");
}

/// Packing efficiency on a sample of 400 conversations of mixed length (rows of 1,024), per policy; printed
/// for the record (run with --nocapture) and checked against what each policy promises.
#[test]
fn packing_efficiency_on_a_sample() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = sample(dir.path(), 400);
    let tokenizer = qwen2();
    let mut efficiencies = Vec::new();
    for policy in [
        PackingPolicy::BestFitDecreasing { window_docs: 256 },
        PackingPolicy::BestFitDecreasingSplit { window_docs: 256 },
        PackingPolicy::ConcatChunk,
    ] {
        let config = ChatSourceConfig {
            policy,
            max_epochs: Some(1),
            ..ChatSourceConfig::new(1024, 4, 3)
        };
        let started = std::time::Instant::now();
        let mut source = ChatSource::open(&path, &tokenizer, config).unwrap();
        let open_s = started.elapsed().as_secs_f64();
        let batches = all_batches(&mut source);
        let stats = source.packing_stats();
        let slots: usize = batches.iter().map(|b| b.tokens.len()).sum();
        let trained: usize = batches.iter().map(|b| b.num_loss_tokens()).sum();
        eprintln!(
            "{policy:?}: {} conversations rendered in {open_s:.3} s, mean {:.0} tokens; rows {}, packing efficiency {:.3}, trained targets / slots {:.3}",
            source.num_conversations(),
            source.report().tokens as f64 / source.num_conversations() as f64,
            stats.rows,
            stats.efficiency(),
            trained as f64 / slots as f64
        );
        efficiencies.push(stats.efficiency());
    }
    // Best fit leaves gaps but should fill most of each row on short conversations; the
    // splitting policies pad only the final row.
    assert!(efficiencies[0] > 0.85, "{efficiencies:?}");
    assert!(
        efficiencies[1] > 0.99 && efficiencies[2] > 0.99,
        "{efficiencies:?}"
    );
}

#[test]
fn tokenizer_without_chat_template_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizers/qwen2");
    let bare = dir.path().join("bare-tokenizer");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::copy(fixture.join("tokenizer.json"), bare.join("tokenizer.json")).unwrap();
    let tokenizer = Tokenizer::from_dir(&bare).unwrap();
    let (path, _) = sample(dir.path(), 3);
    let err = ChatSource::open(&path, &tokenizer, config(None)).unwrap_err();
    assert!(matches!(err, SourceError::Tokenizer(_)), "{err}");
    assert!(err.to_string().contains("chat template"), "{err}");
}

/// A line with `prompt_ids` and `completion_ids` (what `stoke rft` and `stoke distill generate`
/// write) trains on exactly those ids: the prompt is never a target, the completion always is,
/// and its `messages` (here deliberately different text) are not rendered. Unusable ids are
/// reported with their line.
#[test]
fn token_id_lines_are_trained_as_given_without_retokenizing() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = qwen2();
    let prompt = tokenizer
        .apply_chat_template(
            &messages(&[("user", "What is 2 + 3?".to_string())]),
            &ChatOptions {
                add_generation_prompt: true,
                ..ChatOptions::default()
            },
        )
        .unwrap()
        .ids;
    // Not the tokenizer's own encoding of any text: "5" spelled as two odd pieces plus <|im_end|>.
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    let completion = vec![17u32, 18, 19, im_end];
    let vocab = tokenizer.vocab_size() as u32;
    let lines = vec![
        json!({"messages": [{"role": "user", "content": "ignored"},
                            {"role": "assistant", "content": "ignored"}],
               "prompt_ids": prompt, "completion_ids": completion})
        .to_string(), // 1
        json!({"prompt_ids": prompt}).to_string(), // 2
        json!({"prompt_ids": prompt, "completion_ids": []}).to_string(), // 3
        json!({"prompt_ids": prompt, "completion_ids": [5, vocab]}).to_string(), // 4
        json!({"prompt_ids": [1, -2], "completion_ids": [5]}).to_string(), // 5
    ];
    let path = write_jsonl(dir.path(), &lines);
    let mut source = ChatSource::open(&path, &tokenizer, config(Some(1))).unwrap();
    let skipped: Vec<(usize, String)> = source
        .skipped()
        .iter()
        .map(|s| (s.line, s.reason.to_string()))
        .collect();
    assert_eq!(skipped.len(), 4, "{skipped:?}");
    assert_eq!(skipped[0].0, 2);
    assert!(
        skipped[0].1.contains("without `completion_ids`"),
        "{skipped:?}"
    );
    assert_eq!(skipped[1].0, 3);
    assert!(
        skipped[1].1.contains("`completion_ids` is empty"),
        "{skipped:?}"
    );
    assert_eq!(skipped[2].0, 4);
    assert!(
        skipped[2]
            .1
            .contains(&format!("`completion_ids[1]` is {vocab}")),
        "{skipped:?}"
    );
    assert_eq!(skipped[3].0, 5);
    let batches = all_batches(&mut source);
    assert_eq!(batches.len(), 1);
    let batch = &batches[0];
    let positions = piece_positions(batch, 0, 0);
    let inputs: Vec<u32> = positions.iter().map(|&i| batch.tokens[i]).collect();
    let mut whole = prompt.clone();
    whole.extend(&completion);
    assert_eq!(inputs, whole);
    let trained: Vec<u32> = positions
        .iter()
        .filter(|&&i| batch.loss_mask[i])
        .map(|&i| batch.targets[i])
        .collect();
    assert_eq!(trained, completion);
}

/// Stored teacher top-k (`teacher_topk_ids` / `teacher_topk_logprobs`, one list of k per
/// completion token) come back at exactly the loss positions of the packed batches, whatever row
/// and order a conversation lands in; lines with a malformed top-k are reported.
#[test]
fn stored_teacher_top_k_line_up_with_the_trained_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = qwen2();
    // Conversation c: prompt [1, 2, c + 3], completion 30 + 10c + i; top-k row i: ids
    // [10 + i, 20 + c], log-probs [-0.1 i, null].
    let mut lines = Vec::new();
    for c in 0..6u32 {
        let length = 2 + c as usize % 3;
        let completion: Vec<u32> = (0..length as u32).map(|i| 30 + 10 * c + i).collect();
        let ids: Vec<Vec<u32>> = (0..length as u32).map(|i| vec![10 + i, 20 + c]).collect();
        let logprobs: Vec<Vec<Option<f32>>> = (0..length)
            .map(|i| vec![Some(-0.1 * i as f32), None])
            .collect();
        lines.push(
            json!({"prompt_ids": [1, 2, c + 3], "completion_ids": completion,
                   "teacher_topk_ids": ids, "teacher_topk_logprobs": logprobs})
            .to_string(),
        );
    }
    lines.push(
        json!({"prompt_ids": [1], "completion_ids": [5, 6],
               "teacher_topk_ids": [[1, 2]], "teacher_topk_logprobs": [[-1.0, -2.0]]})
        .to_string(),
    ); // 7: one row for two tokens
    lines.push(
        json!({"prompt_ids": [1], "completion_ids": [5],
               "teacher_topk_ids": [[1, 2, 3]], "teacher_topk_logprobs": [[-1.0, -2.0, -3.0]]})
        .to_string(),
    ); // 8: k 3 after k 2
    lines.push(
        json!({"prompt_ids": [1], "completion_ids": [5],
               "teacher_topk_ids": [[1, 2]], "teacher_topk_logprobs": [[0.5, -2.0]]})
        .to_string(),
    ); // 9: not a log-probability
    let path = write_jsonl(dir.path(), &lines);
    let mut source = ChatSource::open(&path, &tokenizer, config(Some(1))).unwrap();
    let skipped: Vec<usize> = source.skipped().iter().map(|s| s.line).collect();
    assert_eq!(skipped, vec![7, 8, 9], "{:?}", source.skipped());
    let table = source.teacher_topk().expect("the lines carry top-k");
    assert_eq!(table.k, 2);
    let mut seen = 0;
    for batch in all_batches(&mut source) {
        let (ids, logprobs) = table.targets(&batch).unwrap();
        let targets: Vec<u32> = (0..batch.loss_mask.len())
            .filter(|&i| batch.loss_mask[i])
            .map(|i| batch.targets[i])
            .collect();
        assert_eq!(ids.len(), 2 * targets.len());
        for (j, target) in targets.iter().enumerate() {
            let (c, i) = ((target - 30) / 10, (target - 30) % 10);
            assert_eq!(&ids[2 * j..2 * j + 2], &[10 + i, 20 + c]);
            assert!((logprobs[2 * j] + 0.1 * i as f32).abs() < 1e-6);
            assert_eq!(logprobs[2 * j + 1], f32::NEG_INFINITY);
            seen += 1;
        }
    }
    assert_eq!(seen, 2 + 3 + 4 + 2 + 3 + 4);
}
