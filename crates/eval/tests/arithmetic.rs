//! The arithmetic task: determinism, exact answers, the train/held-out partition (no held-out
//! question in any training file), the final-answer format, and the written files.

use stoke_eval::arithmetic::{
    ArithmeticTask, Level, Operation, Split, TaskError, final_answer_line, parse_final_answer,
};
use stoke_eval::corpus::{
    DocumentStyle, chat_record, pretraining_document, write_chat_jsonl, write_pretraining_jsonl,
};

fn all_levels() -> ArithmeticTask {
    ArithmeticTask::new(Level::ALL.to_vec(), 0.1).unwrap()
}

#[test]
fn same_seed_gives_same_problems_and_other_seed_differs() {
    let task = all_levels();
    let a = task.problems(Split::Train, 200, 7).unwrap();
    let b = task.problems(Split::Train, 200, 7).unwrap();
    let c = task.problems(Split::Train, 200, 8).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.len(), 200);
}

#[test]
fn every_answer_is_the_exact_result_of_its_steps_and_the_text_shows_them() {
    let task = all_levels();
    for problem in task.problems(Split::Train, 2000, 1).unwrap() {
        let mut previous: Option<i64> = None;
        for step in &problem.steps {
            let exact = match step.operation {
                Operation::Add => step.left + step.right,
                Operation::Subtract => step.left - step.right,
                Operation::Multiply => step.left * step.right,
                Operation::Divide => {
                    assert_eq!(step.left % step.right, 0, "{problem:?}");
                    step.left / step.right
                }
            };
            assert_eq!(step.result, exact, "{problem:?}");
            assert!(step.result >= 2, "{problem:?}");
            if let Some(previous) = previous {
                assert_eq!(step.left, previous, "steps chain: {problem:?}");
            }
            previous = Some(step.result);
            assert!(
                problem.solution.contains(&step.equation()),
                "solution shows {}: {problem:?}",
                step.equation()
            );
        }
        assert_eq!(Some(problem.answer), previous);
        let expected_steps = if problem.level == Level::TwoStep {
            2
        } else {
            1
        };
        assert_eq!(problem.steps.len(), expected_steps);
        if problem.level == Level::SingleDigit {
            let step = problem.steps[0];
            assert!((2..=9).contains(&step.left) && (2..=9).contains(&step.right));
        }
        assert!(problem.question.ends_with('?'));
        assert_eq!(
            parse_final_answer(&problem.chat_solution()),
            Some(problem.answer)
        );
    }
}

#[test]
fn levels_are_drawn_only_from_the_configured_set_and_all_of_them_appear() {
    let task = ArithmeticTask::new(vec![Level::SingleDigit, Level::TwoStep], 0.1).unwrap();
    let problems = task.problems(Split::Train, 300, 3).unwrap();
    assert!(problems.iter().all(|p| p.level != Level::OneStep));
    assert!(problems.iter().any(|p| p.level == Level::SingleDigit));
    assert!(problems.iter().any(|p| p.level == Level::TwoStep));
}

#[test]
fn held_out_questions_are_distinct_and_never_appear_in_training_files() {
    let task = all_levels();
    let train = task.problems(Split::Train, 6000, 11).unwrap();
    let held_out = task.problems(Split::HeldOut, 400, 11).unwrap();
    let mut questions: Vec<&str> = held_out.iter().map(|p| p.question.as_str()).collect();
    questions.sort_unstable();
    questions.dedup();
    assert_eq!(questions.len(), held_out.len(), "held-out problems repeat");
    for p in &train {
        assert_eq!(task.split_of(&p.question), Split::Train);
    }
    for p in &held_out {
        assert_eq!(task.split_of(&p.question), Split::HeldOut);
    }

    let dir = tempfile::tempdir().unwrap();
    write_pretraining_jsonl(&dir.path().join("corpus.jsonl"), &train, 5).unwrap();
    write_chat_jsonl(&dir.path().join("sft.jsonl"), &train).unwrap();
    let corpus = std::fs::read_to_string(dir.path().join("corpus.jsonl")).unwrap();
    let chats = std::fs::read_to_string(dir.path().join("sft.jsonl")).unwrap();
    // JSON escaping leaves these texts unchanged (no quotes, backslashes or control characters).
    for p in &held_out {
        assert!(!corpus.contains(&p.question), "in corpus: {}", p.question);
        assert!(!chats.contains(&p.question), "in SFT data: {}", p.question);
    }
    // The check has teeth: training questions are found the same way.
    assert!(corpus.contains(&train[0].question) && chats.contains(&train[0].question));
}

#[test]
fn final_answer_line_parses_strictly() {
    assert_eq!(final_answer_line(42), "#### 42");
    assert_eq!(parse_final_answer("3 + 4 = 7.\n#### 7"), Some(7));
    assert_eq!(parse_final_answer("#### 1\nmore\n#### 12\n"), Some(12));
    assert_eq!(parse_final_answer("The answer is 7."), None);
    assert_eq!(parse_final_answer("#### 7 apples"), None);
    assert_eq!(parse_final_answer("####"), None);
}

#[test]
fn chat_records_are_openai_messages_ending_in_the_final_answer_line() {
    let problem = all_levels().problems(Split::Train, 1, 2).unwrap().remove(0);
    let json = serde_json::to_value(chat_record(&problem)).unwrap();
    let messages = json["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["content"], problem.question.as_str());
    assert_eq!(messages[1]["role"], "assistant");
    let reply = messages[1]["content"].as_str().unwrap();
    assert!(
        reply.ends_with(&format!("\n#### {}", problem.answer)),
        "{reply}"
    );
}

#[test]
fn pretraining_documents_vary_in_framing_and_never_use_the_chat_answer_line() {
    let task = all_levels();
    let problems = task.problems(Split::Train, 3000, 4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corpus.jsonl");
    let written = write_pretraining_jsonl(&path, &problems, 9).unwrap();
    assert_eq!(written.problems, 3000);
    assert!(
        written.records < 3000 && written.records > 1000,
        "{written:?}"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("####"));
    for marker in ["Question: ", "Problem 1. ", "Q: ", "That makes "] {
        assert!(text.contains(marker), "no {marker:?} document");
    }
    let lines: Vec<&str> = text.lines().collect();
    let mut distinct = lines.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() as f64 > 0.95 * lines.len() as f64);
    // Names and objects vary too.
    for word in ["Mia", "Noah", "marbles", "cookies"] {
        assert!(text.contains(word), "{word}");
    }
    let doc = pretraining_document(&problems[..2], DocumentStyle::ProblemSolution);
    assert!(doc.contains("Problem 1. ") && doc.contains("Problem 2. "));
    assert!(doc.contains(&format!("So the answer is {}.", problems[1].answer)));
}

#[test]
fn bad_task_settings_are_rejected() {
    assert!(matches!(
        ArithmeticTask::new(vec![], 0.1),
        Err(TaskError::NoLevels)
    ));
    assert!(matches!(
        ArithmeticTask::new(vec![Level::OneStep], 1.0),
        Err(TaskError::HeldOutFraction(_))
    ));
    assert!(matches!(
        ArithmeticTask::new(vec![Level::OneStep], f64::NAN),
        Err(TaskError::HeldOutFraction(_))
    ));
}

#[test]
fn the_held_out_fraction_sets_the_share_of_questions_held_out() {
    let task = ArithmeticTask::new(vec![Level::OneStep], 0.25).unwrap();
    // Draw from the held-out stream's perspective: all problems of both splits, then count.
    let train = task.problems(Split::Train, 3000, 1).unwrap();
    let held = task.problems(Split::HeldOut, 1000, 1).unwrap();
    assert_eq!(train.len(), 3000);
    assert_eq!(held.len(), 1000);
    let other = ArithmeticTask::new(vec![Level::OneStep], 0.05).unwrap();
    let moved = held
        .iter()
        .filter(|p| other.split_of(&p.question) == Split::Train)
        .count();
    // About 80% of the 25% bucket lies outside the 5% bucket (nested thresholds on one hash).
    assert!((650..=950).contains(&moved), "{moved}");
}
