//! The stdin/stdout reward on the sandbox: per-case fractions, first-N cases, binary scoring,
//! timeouts and missing cases.

use std::time::Duration;

use stoke_reward::stdio_tests::{
    CaseScoring, OutputComparison, StdioTestsConfig, StdioTestsVerifier,
};
use stoke_reward::{IoCase, Outcome, Reference, RewardInput, Verifier};
use stoke_sandbox::{IsolationLevel, Sandbox, SandboxConfig};

fn sandbox() -> Sandbox {
    let config = SandboxConfig {
        min_isolation: IsolationLevel::Basic,
        wall_timeout: Duration::from_secs(2),
        cpu_seconds: 2,
        ..SandboxConfig::default()
    };
    Sandbox::new(config).expect("sandbox starts")
}

fn cases() -> Reference {
    let case = |input: &str, output: &str| IoCase {
        input: input.into(),
        output: output.into(),
    };
    Reference {
        cases: Some(vec![
            case("2\n", "4\n"),
            case("3\n", "9"),
            case("10\n", "100\n"),
            case("0\n", "0"),
        ]),
        ..Reference::default()
    }
}

/// Squares its input, except that it prints 1 for input 0 (fails one case of four).
const MOSTLY_RIGHT: &str = "```python\nn = int(input())\nprint(n * n if n else 1)\n```";

#[test]
fn fraction_scoring_counts_cases_and_first_n_limits_them() {
    let sandbox = sandbox();
    let reference = cases();
    let fraction = StdioTestsVerifier::new(&StdioTestsConfig::default(), sandbox.clone()).unwrap();
    let outcome = fraction.score(&RewardInput::new("", MOSTLY_RIGHT, &reference));
    assert_eq!(
        (
            outcome.outcome,
            outcome.details.passed,
            outcome.details.total
        ),
        (Outcome::Partial, Some(3), Some(4))
    );
    assert!((outcome.score - 0.75).abs() < 1e-12);
    let first_three = StdioTestsVerifier::new(
        &StdioTestsConfig {
            max_cases: Some(3),
            ..StdioTestsConfig::default()
        },
        sandbox,
    )
    .unwrap();
    let outcome = first_three.score(&RewardInput::new("", MOSTLY_RIGHT, &reference));
    assert_eq!((outcome.outcome, outcome.score), (Outcome::Correct, 1.0));
}

#[test]
fn binary_scoring_gives_nothing_for_partial_passes() {
    let config = StdioTestsConfig {
        scoring: CaseScoring::Binary,
        ..StdioTestsConfig::default()
    };
    let verifier = StdioTestsVerifier::new(&config, sandbox()).unwrap();
    let outcome = verifier.score(&RewardInput::new("", MOSTLY_RIGHT, &cases()));
    assert_eq!((outcome.outcome, outcome.score), (Outcome::Wrong, 0.0));
}

#[test]
fn a_hanging_program_times_out() {
    let verifier = StdioTestsVerifier::new(&StdioTestsConfig::default(), sandbox()).unwrap();
    let reference = Reference {
        cases: Some(vec![IoCase {
            input: "1\n".into(),
            output: "1".into(),
        }]),
        ..Reference::default()
    };
    let outcome = verifier.score(&RewardInput::new("", "while True:\n    pass\n", &reference));
    assert_eq!(
        (outcome.outcome, outcome.score),
        (Outcome::Timeout, 0.0),
        "{outcome:?}"
    );
}

#[test]
fn crashing_programs_are_wrong_and_missing_cases_are_reported() {
    let verifier = StdioTestsVerifier::new(&StdioTestsConfig::default(), sandbox()).unwrap();
    let outcome = verifier.score(&RewardInput::new("", "raise SystemExit(3)", &cases()));
    assert_eq!(outcome.outcome, Outcome::Wrong);
    let outcome = verifier.score(&RewardInput::new("", "print(1)", &Reference::default()));
    assert_eq!(outcome.outcome, Outcome::MissingField);
    let empty = Reference {
        cases: Some(Vec::new()),
        ..Reference::default()
    };
    assert_eq!(
        verifier
            .score(&RewardInput::new("", "print(1)", &empty))
            .outcome,
        Outcome::UnparseableGold
    );
}

fn one_case(output: &str) -> Reference {
    Reference {
        cases: Some(vec![IoCase {
            input: "2\n".into(),
            output: output.into(),
        }]),
        ..Reference::default()
    }
}

#[test]
fn stdio_tests_rejects_empty_whitespace_and_extra_output() {
    for comparison in [OutputComparison::Tokens, OutputComparison::Lines] {
        let config = StdioTestsConfig {
            comparison,
            ..StdioTestsConfig::default()
        };
        let verifier = StdioTestsVerifier::new(&config, sandbox()).unwrap();
        for program in [
            "pass",
            "print()",
            "print('   \\n\\t')",
            "print(4)\nprint(4)",
            "print('4 extra')",
            "print(4.0)",
            "import sys; print(4); sys.exit(1)",
        ] {
            let outcome = verifier.score(&RewardInput::new("", program, &one_case("4\n")));
            assert_eq!(
                outcome.score, 0.0,
                "{comparison:?} {program:?}: {outcome:?}"
            );
        }
        let right = verifier.score(&RewardInput::new(
            "",
            "print(int(input())**2)",
            &one_case("4\n"),
        ));
        assert_eq!(right.outcome, Outcome::Correct, "{comparison:?}");
    }
}

#[test]
fn stdio_tests_rejects_cases_whose_expected_outputs_are_all_blank() {
    // A program that prints nothing would match every case: a dataset problem, not a reward.
    let verifier = StdioTestsVerifier::new(&StdioTestsConfig::default(), sandbox()).unwrap();
    let outcome = verifier.score(&RewardInput::new("", "pass", &one_case(" \n")));
    assert_eq!(
        (outcome.outcome, outcome.score),
        (Outcome::UnparseableGold, 0.0),
        "{outcome:?}"
    );
}
