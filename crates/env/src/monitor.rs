//! Reward-hacking signals of agentic episodes, as plain predicates the pipeline's metrics and
//! alerts use (seed 002: hacking "only shows up in Agent task environments").
//!
//! What it is: which workspace paths count as the grader's (tests, test runners, graders), and
//! the shift test for per-update means (episode length, turns). What it is not: the metrics or
//! the alerts themselves (the pipeline's monitor), or a block (a flagged call still ran; the
//! monitor makes it visible, the environment's isolation is what contains it).

/// Whether `path` (relative, `/`-separated) belongs to the grader rather than the task: test
/// files and folders, pytest's `conftest.py`, and anything named like a grader or judge.
pub fn is_protected_path(path: &str) -> bool {
    let path = path.trim_start_matches("./");
    path.split('/').any(|part| {
        let lower = part.to_ascii_lowercase();
        lower == "tests"
            || lower == "test"
            || lower == "conftest.py"
            || lower.starts_with("test_")
            || lower.ends_with("_test.py")
            || lower.contains("grader")
            || lower.contains("judge")
            || lower.contains("hidden")
    })
}

/// Whether an update's mean `current` is a sudden shift from the running mean `baseline` of
/// earlier updates: more than `factor` times it, or less than `1 / factor` of it. Baselines of
/// 0 never flag (nothing to compare to).
pub fn sudden_shift(baseline: f64, current: f64, factor: f64) -> bool {
    baseline > 0.0
        && current.is_finite()
        && (current > baseline * factor || current * factor < baseline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_and_graders_are_protected_and_task_files_are_not() {
        for path in [
            "tests/test_main.py",
            "test_solution.py",
            "pkg/tests/data.json",
            "conftest.py",
            "grader.py",
            "judge/run.sh",
            "hidden_tests.py",
            "./utils_test.py",
        ] {
            assert!(is_protected_path(path), "{path}");
        }
        for path in [
            "solution.py",
            "src/main.rs",
            "README.md",
            "latest.txt",
            "contest.py",
        ] {
            assert!(!is_protected_path(path), "{path}");
        }
    }

    #[test]
    fn shifts_are_ratios_against_a_positive_baseline() {
        assert!(sudden_shift(2.0, 4.5, 2.0));
        assert!(sudden_shift(2.0, 0.9, 2.0));
        assert!(!sudden_shift(2.0, 3.9, 2.0));
        assert!(!sudden_shift(0.0, 10.0, 2.0));
        assert!(!sudden_shift(2.0, f64::NAN, 2.0));
    }
}
