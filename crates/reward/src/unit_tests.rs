//! Code against unit tests, HumanEval style: the program is `prompt + completion` (or the
//! completion alone, with the prompt's imports, when it defines the entry point itself), the
//! tests define `check(candidate)`, and the harness calls `check(entry_point)` in the sandbox.
//!
//! Config (`kind = "unit_tests"`):
//! - `scoring`: `"binary"` (default: 1 only when every assertion passed) or `"fraction"`
//!   (fraction of assertion sites that passed).
//! - `builtin_results_only` (bool, default true): every value the function under test returns
//!   must be built from Python's builtin data types (numbers, strings, bytes, None, lists,
//!   tuples, sets, dicts; exact types, no subclasses), and the solution runs in a process of
//!   its own (see below); this stops the "always-equal object" hack and every other way of
//!   tampering with the tests from inside the interpreter. Turn it off only for trusted
//!   completions whose functions legitimately return other objects.
//! - `extract_fenced_code` (bool, default true): use the last ```python block of the completion
//!   when there is one.
//!
//! Reads `tests`, `entry_point` and `prompt`.
//!
//! How a run is judged (`builtin_results_only = true`, the default): two processes. The judge
//! (`unit_tests_judge.py`, trusted, written here) runs as `python3 -I` (isolated mode: the work
//! dir is not on `sys.path`, and the judge strips any path inside it again), imports everything
//! it uses, ignores every warning (showing one reads source lines) and SIGINT, reads a random
//! nonce from stdin and closes it, marks itself non-dumpable (so a same-uid process cannot read
//! its memory through `/proc`), rewrites every `assert` of the tests with Python's `ast` module so
//! that each assertion site reports pass or fail instead of aborting `check`, and compiles the
//! tests and the prompt (under names that are not files). Only then does it start the solution
//! process (`unit_tests_solution_process.py`, a fresh `exec` in a process group of its own, so it
//! never holds the nonce) with stdin closed and stdout sent to stderr. The untrusted solution
//! runs only there. The judge executes the tests (and the prompt, trusted, for helpers such as
//! HumanEval's `poly`, and for its imports) in its own interpreter; every module either imports,
//! directly, lazily inside the stdlib (`heapq` through `Counter.most_common`) or through the
//! warnings machinery (`linecache`), comes from the interpreter's read-only library, never from a
//! `.py`, package or sourceless `.pyc` the solution wrote into the work dir. `candidate` is a
//! proxy that sends the arguments over a pipe and decodes the reply into plain Python data built
//! by the judge itself (ints, floats, complex, str, bytes, None, bool, lists, tuples, sets,
//! frozensets, dicts). An exception comes back as data: its builtin class by name (so tests can
//! check for `ValueError`), except `StopIteration` and `StopAsyncIteration`, which would end the
//! judge's own iteration early (`all(map(candidate, ...))` would pass) and become `RuntimeError`
//! as PEP 479 does for generators; an unknown or unconstructible class is `RuntimeError`. So
//! every comparison an assertion makes runs on objects the solution never touched, with builtins
//! it never patched: the always-equal object, patched `builtins`, forged counters,
//! `sys.settrace`, frame or `gc` inspection and forged report lines all have nothing to reach.
//! The judge kills the solution's process group and reaps it before it writes `nonce passed
//! total status` to its own stdout at the end; a solution that exits, crashes or hangs makes its
//! calls fail (or the run time out). The integrity suite (`tests/code_integrity.rs`, one test per
//! forging mechanism) and the HumanEval sweep (every generic forger passes 0 of 164) pin this.
//!
//! What remains (the two-process threat model): the solution process may kill or stop the
//! judge (same uid), which scores 0 or times out, never 1; it may answer calls by any means
//! (the judge deletes `tests.py` and `prompt.py` before the solution starts, so the expected
//! outputs are not on disk to replay, but a solution may still special-case the inputs it is
//! called with); an exception class other than the two above still reaches the tests as itself,
//! so it diverts control only where the tests' own code catches it (a test-defined `__getitem__`
//! that calls the candidate and ends old-style iteration on `IndexError`); and where the sandbox
//! runs without seccomp and the kernel lets a same-uid process trace another, memory inspection
//! of the judge is only as hard as `PR_SET_DUMPABLE` makes it. Arguments must be plain data too:
//! a test that passes a function or another object to the candidate fails that call.
//!
//! With `builtin_results_only = false` the solution and the tests share one interpreter (the
//! older in-process harness, needed when results are arbitrary objects): the nonce is still
//! read before the solution runs, but code in the same interpreter can find it (frames, `gc`)
//! or tamper with the counters and builtins. Use it only for trusted completions.

use serde::{Deserialize, Serialize};
use stoke_sandbox::{Program, Sandbox};

use crate::code::{abnormal_outcome, extract_code, nonce, run_all};
use crate::error::ConfigError;
use crate::verifier::{Details, Outcome, RewardInput, RewardOutcome, Verifier, clip_detail};

/// The trusted judge of the two-process harness; argv[1] is the entry point.
const JUDGE: &str = include_str!("unit_tests_judge.py");

/// The untrusted side of the two-process harness: loads `solution.py` and answers calls.
const SOLUTION_PROCESS: &str = include_str!("unit_tests_solution_process.py");

/// The in-process harness (`builtin_results_only = false`): trusts the solution not to tamper.
/// argv[1] is the entry point; the solution and tests are files.
const IN_PROCESS_HARNESS: &str = r#"import ast as _ast, os as _os, sys as _sys
def _stoke_main():
    nonce = _sys.stdin.readline().strip()
    result_fd = _os.dup(1)
    entry_point = _sys.argv[1]
    builtin_results_only = _sys.argv[2] == "builtin"
    plain_types = (int, float, complex, str, bytes, bool, type(None))
    def check_plain(value, depth=0):
        kind = type(value)
        if depth > 50:
            raise TypeError("result nested too deeply")
        if kind in plain_types:
            return
        if kind in (list, tuple, set, frozenset):
            for item in value:
                check_plain(item, depth + 1)
            return
        if kind is dict:
            for key, item in value.items():
                check_plain(key, depth + 1)
                check_plain(item, depth + 1)
            return
        raise TypeError("result of type %s is not a builtin data type" % kind.__name__)
    def guard(function):
        def guarded(*args, **kwargs):
            result = function(*args, **kwargs)
            check_plain(result)
            return result
        return guarded
    with open("solution.py") as f:
        solution = f.read()
    with open("tests.py") as f:
        tests = f.read()
    def report(passed, total, status):
        _os.write(result_fd, ("\n%s %d %d %s\n" % (nonce, passed, total, status)).encode())
    try:
        tree = _ast.parse(tests, "tests.py")
    except SyntaxError:
        report(0, 0, "tests_syntax_error")
        return
    passed_sites, failed_sites = set(), set()
    class Rewrite(_ast.NodeTransformer):
        sites = 0
        def visit_Assert(self, node):
            site = Rewrite.sites
            Rewrite.sites += 1
            wrapper = _ast.parse(
                "try:\n    pass\n    _stoke_ok_(%d)\nexcept BaseException:\n    _stoke_bad_(%d)\n" % (site, site)
            ).body[0]
            wrapper.body[0] = node
            return wrapper
    tree = _ast.fix_missing_locations(Rewrite().visit(tree))
    total = Rewrite.sites
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    namespace["_stoke_ok_"] = passed_sites.add
    namespace["_stoke_bad_"] = failed_sites.add
    try:
        exec(compile(solution, "solution.py", "exec"), namespace)
    except SystemExit:
        report(0, total, "exited_while_loading")
        return
    except BaseException as error:
        report(0, total, "load_error:" + type(error).__name__)
        return
    try:
        exec(compile(tree, "tests.py", "exec"), namespace)
        check = namespace["check"]
        candidate = namespace[entry_point]
        if builtin_results_only:
            candidate = guard(candidate)
    except BaseException as error:
        report(0, total, "setup_error:" + type(error).__name__)
        return
    status = "ok"
    try:
        check(candidate)
    except BaseException as error:
        status = "check_raised:" + type(error).__name__
    passed = len(passed_sites - failed_sites)
    report(passed, total, status)
_stoke_main()
"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestScoring {
    #[default]
    Binary,
    Fraction,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UnitTestsConfig {
    pub scoring: TestScoring,
    pub builtin_results_only: bool,
    pub extract_fenced_code: bool,
}

impl Default for UnitTestsConfig {
    fn default() -> Self {
        Self {
            scoring: TestScoring::Binary,
            builtin_results_only: true,
            extract_fenced_code: true,
        }
    }
}

pub struct UnitTestsVerifier {
    scoring: TestScoring,
    builtin_results_only: bool,
    extract_fenced_code: bool,
    sandbox: Sandbox,
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The solution file: `prompt + code`, or the prompt's import lines + `code` when the code
/// defines the entry point itself.
pub fn solution_source(prompt: &str, code: &str, entry_point: &str) -> String {
    if code.contains(&format!("def {entry_point}(")) {
        let imports: Vec<&str> = prompt
            .lines()
            .filter(|line| line.starts_with("import ") || line.starts_with("from "))
            .collect();
        format!("{}\n{}", imports.join("\n"), code)
    } else {
        format!("{prompt}{code}")
    }
}

struct Prepared {
    program: Program,
    nonce: String,
    code: String,
}

impl UnitTestsVerifier {
    pub fn new(config: &UnitTestsConfig, sandbox: Sandbox) -> Result<Self, ConfigError> {
        Ok(Self {
            scoring: config.scoring,
            builtin_results_only: config.builtin_results_only,
            extract_fenced_code: config.extract_fenced_code,
            sandbox,
        })
    }

    fn prepare(&self, input: &RewardInput<'_>) -> Result<Prepared, Box<RewardOutcome>> {
        let Some(tests) = input.reference.tests.as_deref() else {
            return Err(Box::new(RewardOutcome::missing("tests")));
        };
        let Some(entry_point) = input.reference.entry_point.as_deref() else {
            return Err(Box::new(RewardOutcome::missing("entry_point")));
        };
        if !is_identifier(entry_point) {
            return Err(Box::new(RewardOutcome::failed(
                Outcome::UnparseableGold,
                "entry_point is not a Python identifier",
            )));
        }
        let code = if self.extract_fenced_code {
            extract_code(input.completion)
        } else {
            input.completion
        };
        let nonce = nonce();
        let solution = solution_source(input.prompt, code, entry_point).into_bytes();
        let program = if self.builtin_results_only {
            Program {
                source: JUDGE.to_string(),
                stdin: format!("{nonce}\n").into_bytes(),
                files: vec![
                    ("solution.py".into(), solution),
                    ("tests.py".into(), tests.as_bytes().to_vec()),
                    ("prompt.py".into(), input.prompt.as_bytes().to_vec()),
                    ("child.py".into(), SOLUTION_PROCESS.as_bytes().to_vec()),
                ],
                args: vec![entry_point.to_string()],
                isolated: true,
                ..Program::python("")
            }
        } else {
            Program {
                source: IN_PROCESS_HARNESS.to_string(),
                stdin: format!("{nonce}\n").into_bytes(),
                files: vec![
                    ("solution.py".into(), solution),
                    ("tests.py".into(), tests.as_bytes().to_vec()),
                ],
                args: vec![entry_point.to_string(), "any".to_string()],
                isolated: true,
                ..Program::python("")
            }
        };
        Ok(Prepared {
            program,
            nonce,
            code: code.to_string(),
        })
    }

    fn judge(&self, prepared: &Prepared, result: &stoke_sandbox::ExecResult) -> RewardOutcome {
        let mut details = Details {
            extracted: Some(clip_detail(&prepared.code)),
            isolation: Some(result.isolation.level.name().to_string()),
            ..Details::default()
        };
        let stdout = result.stdout_text();
        let report = stdout.lines().rev().find_map(|line| {
            let rest = line.strip_prefix(prepared.nonce.as_str())?.trim();
            let mut parts = rest.splitn(3, ' ');
            let passed: usize = parts.next()?.parse().ok()?;
            let total: usize = parts.next()?.parse().ok()?;
            Some((passed, total, parts.next().unwrap_or("").to_string()))
        });
        let Some((passed, total, status)) = report else {
            if let Some((outcome, reason)) = abnormal_outcome(result) {
                details.reason = Some(reason);
                return RewardOutcome::new(0.0, outcome, details);
            }
            details.reason = Some(format!(
                "the program ended before the tests finished ({:?}); stderr: {}",
                result.status,
                clip_detail(&result.stderr_text())
            ));
            return RewardOutcome::wrong(details);
        };
        if status == "tests_syntax_error" || status.starts_with("setup_error:") && total == 0 {
            details.reason = Some(status);
            return RewardOutcome::new(0.0, Outcome::UnparseableGold, details);
        }
        details.passed = Some(passed);
        details.total = Some(total);
        let all_passed = status == "ok" && total > 0 && passed == total;
        if status != "ok" {
            details.reason = Some(status);
        }
        if all_passed {
            return RewardOutcome::correct(details);
        }
        let fraction = if total == 0 {
            0.0
        } else {
            passed as f64 / total as f64
        };
        match self.scoring {
            TestScoring::Binary => RewardOutcome::wrong(details),
            TestScoring::Fraction if passed > 0 => {
                RewardOutcome::new(fraction, Outcome::Partial, details)
            }
            TestScoring::Fraction => RewardOutcome::wrong(details),
        }
    }
}

impl Verifier for UnitTestsVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        self.score_group(std::slice::from_ref(input)).remove(0)
    }

    /// Runs the whole group concurrently on the sandbox pool.
    fn score_group(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        let prepared: Vec<Result<Prepared, Box<RewardOutcome>>> =
            group.iter().map(|input| self.prepare(input)).collect();
        let programs: Vec<Program> = prepared
            .iter()
            .filter_map(|p| p.as_ref().ok())
            .map(|p| p.program.clone())
            .collect();
        let mut results = run_all(&self.sandbox, programs).into_iter();
        prepared
            .into_iter()
            .map(|prepared| match prepared {
                Err(outcome) => *outcome,
                Ok(prepared) => match results.next() {
                    Some(result) => self.judge(&prepared, &result),
                    None => {
                        RewardOutcome::failed(Outcome::SandboxError, "no result for this program")
                    }
                },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_definitions_replace_the_prompt_but_keep_its_imports() {
        let prompt =
            "from typing import List\n\ndef f(x: List[int]) -> int:\n    \"\"\"doc\"\"\"\n";
        let source = solution_source(prompt, "def f(x):\n    return 1\n", "f");
        assert_eq!(source, "from typing import List\ndef f(x):\n    return 1\n");
        let body = solution_source(prompt, "    return 1\n", "f");
        assert!(body.starts_with(prompt) && body.ends_with("    return 1\n"));
    }

    #[test]
    fn entry_points_must_be_identifiers() {
        assert!(is_identifier("has_close_elements"));
        assert!(!is_identifier("f); import os; (x"));
        assert!(!is_identifier(""));
    }
}
