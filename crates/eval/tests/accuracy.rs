//! Held-out accuracy: scoring rules (strict vs flexible), pass@k, and a full evaluation through
//! the rollout engine with a randomly initialised tiny model (it runs, it is deterministic, and
//! it scores about nothing).

use std::path::Path;

use candle_core::Device;
use stoke_eval::accuracy::{AccuracyConfig, AccuracyError, evaluate, pass_at_k, score};
use stoke_eval::arithmetic::{ArithmeticTask, Level, Problem, Split};
use stoke_model::{ModelConfig, Transformer};
use stoke_reward::exact_match::ExactMatchVerifier;
use stoke_tokenizer::hf::Tokenizer;
use stoke_tokenizer::train::{TrainerConfig, WordCounts, train_bpe};

const TEMPLATE: &str = r"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn problems(count: usize) -> Vec<Problem> {
    ArithmeticTask::new(vec![Level::SingleDigit], 0.1)
        .unwrap()
        .problems(Split::HeldOut, count, 3)
        .unwrap()
}

fn verifier() -> ExactMatchVerifier {
    stoke_eval::accuracy::answer_verifier().unwrap()
}

/// A small BPE with ChatML special tokens and the generation-tagged template.
fn chat_tokenizer(dir: &Path) -> Tokenizer {
    let texts: Vec<String> = problems(200)
        .iter()
        .map(|p| format!("{} {}", p.question, p.chat_solution()))
        .collect();
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from);
    let config = TrainerConfig::new(300, specials.to_vec());
    let mut words = WordCounts::new(&config.pattern).unwrap();
    words.add_texts(&texts);
    train_bpe(&words, &config, |_| {})
        .unwrap()
        .save(dir)
        .unwrap();
    let tokenizer_config = serde_json::json!({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": TEMPLATE,
    });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
    Tokenizer::from_dir(dir).unwrap()
}

fn tiny_model(vocab_size: usize, eos: u32) -> Transformer {
    let json = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": true, "max_position_embeddings": 256,
        "eos_token_id": eos,
    });
    let config = ModelConfig::from_json_str(&json.to_string(), Path::new("<test>")).unwrap();
    Transformer::init(config, &Device::Cpu, 5).unwrap()
}

#[test]
fn strict_score_needs_the_answer_line_and_flexible_takes_the_last_number() {
    let problem = &problems(1)[0];
    let answer = problem.answer;
    let v = verifier();
    let right = score(&v, problem, problem.chat_solution(), 10);
    assert!(right.correct && right.flexible_correct && right.formatted);

    let unformatted = score(&v, problem, format!("It makes {answer}."), 5);
    assert!(!unformatted.correct && unformatted.flexible_correct && !unformatted.formatted);

    let wrong = score(
        &v,
        problem,
        format!("{}\n#### {}", problem.solution, answer + 1),
        10,
    );
    assert!(!wrong.correct && !wrong.flexible_correct && wrong.formatted);

    let empty = score(&v, problem, String::new(), 0);
    assert!(!empty.correct && !empty.flexible_correct);
}

#[test]
fn pass_at_k_matches_the_closed_form() {
    assert_eq!(pass_at_k(5, 0, 1), 0.0);
    assert_eq!(pass_at_k(5, 5, 3), 1.0);
    assert!((pass_at_k(10, 3, 1) - 0.3).abs() < 1e-12);
    // 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert!((pass_at_k(4, 2, 2) - 5.0 / 6.0).abs() < 1e-12);
    // k > n - c: every draw of k contains a right one
    assert_eq!(pass_at_k(4, 3, 2), 1.0);
}

#[test]
fn a_random_model_is_evaluated_deterministically_and_scores_about_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = chat_tokenizer(dir.path());
    let eos = tokenizer.token_to_id("<|im_end|>").unwrap();
    let model = tiny_model(tokenizer.vocab_size(), eos);
    let held_out = problems(24);
    let config = AccuracyConfig {
        batch_size: 10,
        max_new_tokens: 12,
    };
    let first = evaluate(&model, &tokenizer, &held_out, &config).unwrap();
    assert_eq!(first.samples, 24);
    assert_eq!(first.records.len(), 24);
    for (record, problem) in first.records.iter().zip(&held_out) {
        assert_eq!(record.question, problem.question);
        assert_eq!(record.answer, problem.answer);
        assert!(record.completion_tokens >= 1 && record.completion_tokens <= 12);
    }
    assert!(first.accuracy <= 0.1, "{}", first.accuracy);
    assert_eq!(first.by_level.len(), 1);
    assert_eq!(first.by_level[0].level, Level::SingleDigit);
    assert_eq!(first.by_level[0].samples, 24);
    assert_eq!(first.by_level[0].accuracy, first.accuracy);
    assert!(first.generated_tokens > 0);
    let second = evaluate(&model, &tokenizer, &held_out, &config).unwrap();
    let completions = |r: &stoke_eval::AccuracyReport| {
        r.records
            .iter()
            .map(|s| s.completion.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(completions(&first), completions(&second));
    // Batching does not change greedy completions.
    let one_batch = evaluate(
        &model,
        &tokenizer,
        &held_out,
        &AccuracyConfig {
            batch_size: 64,
            ..config.clone()
        },
    )
    .unwrap();
    assert_eq!(completions(&first), completions(&one_batch));

    assert!(matches!(
        evaluate(&model, &tokenizer, &[], &config),
        Err(AccuracyError::NoProblems)
    ));
    assert!(matches!(
        evaluate(
            &model,
            &tokenizer,
            &held_out,
            &AccuracyConfig {
                batch_size: 0,
                max_new_tokens: 4
            }
        ),
        Err(AccuracyError::BadConfig)
    ));
}
