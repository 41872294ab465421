//! Reward integrity of the code rewards: a table of forging attempts, one test per mechanism,
//! each a completion that does not solve its task and must score 0 under the default config.
//! The table grows with every finding (the sandbox red-team of issue 11 found the first
//! entries: modules shadowed inside the trusted judge, `StopIteration` crossing into the judge).
//!
//! Every test also checks that the honest solution of the same task still passes, so a test
//! cannot pass by breaking the harness.

mod common;

use common::forgers::{self, JUDGE_PAYLOAD};
use stoke_reward::stdio_tests::{StdioTestsConfig, StdioTestsVerifier};
use stoke_reward::unit_tests::{UnitTestsConfig, UnitTestsVerifier};
use stoke_reward::{IoCase, Outcome, Reference, RewardInput, RewardOutcome, Verifier};
use stoke_sandbox::{IsolationLevel, Sandbox, SandboxConfig};

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        min_isolation: IsolationLevel::Basic,
        workers: 4,
        ..SandboxConfig::default()
    })
    .expect("sandbox starts")
}

fn unit_tests() -> UnitTestsVerifier {
    UnitTestsVerifier::new(&UnitTestsConfig::default(), sandbox()).unwrap()
}

/// One task: a prompt (trusted, run by the judge too), its tests and the honest body.
struct Task {
    prompt: &'static str,
    tests: &'static str,
    entry_point: &'static str,
    honest_body: &'static str,
}

impl Task {
    fn score(&self, completion: &str) -> RewardOutcome {
        let reference = Reference {
            tests: Some(self.tests.to_string()),
            entry_point: Some(self.entry_point.to_string()),
            ..Reference::default()
        };
        unit_tests().score(&RewardInput::new(self.prompt, completion, &reference))
    }

    /// The honest solution passes and `completion` scores 0.
    fn assert_forgery_fails(&self, mechanism: &str, completion: &str) {
        let honest = self.score(self.honest_body);
        assert_eq!(
            honest.outcome,
            Outcome::Correct,
            "{mechanism}: the honest solution must pass: {honest:?}"
        );
        let forged = self.score(completion);
        assert_eq!(
            forged.score, 0.0,
            "{mechanism}: forged a reward: {forged:?}"
        );
        assert_ne!(forged.outcome, Outcome::Correct, "{mechanism}: {forged:?}");
    }
}

/// HumanEval-style: the prompt imports `typing`, which the judge executes after the solution
/// process has started.
const TYPED: Task = Task {
    prompt: "from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    \"\"\"Sum of xs.\"\"\"\n",
    tests: "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n    assert candidate([]) == 0\n",
    entry_point: "total",
    honest_body: "    return sum(xs)\n",
};

/// A wrong body (a list, so the tests get as far as using it), then module-level code that
/// writes `payload` as `file` in the work dir.
fn writes(file: &str, payload: &str) -> String {
    format!(
        "    return ['z']\nimport os as _os\n_os.makedirs(_os.path.dirname({file:?}) or '.', exist_ok=True)\nwith open({file:?}, 'w') as _f:\n    _f.write({payload:?})\n"
    )
}

#[test]
fn module_shadowing_typing_py_imported_by_the_prompt() {
    TYPED.assert_forgery_fails("typing.py", &writes("typing.py", JUDGE_PAYLOAD));
}

#[test]
fn module_shadowing_typing_package_imported_by_the_prompt() {
    TYPED.assert_forgery_fails("typing/", &writes("typing/__init__.py", JUDGE_PAYLOAD));
}

#[test]
fn module_shadowing_sourceless_typing_pyc_imported_by_the_prompt() {
    let completion = format!(
        "    return -1\nimport importlib.util as _u, marshal as _m\nwith open('typing.pyc', 'wb') as _f:\n    _f.write(_u.MAGIC_NUMBER + b'\\0' * 12 + _m.dumps(compile({JUDGE_PAYLOAD:?}, 't', 'exec')))\n"
    );
    TYPED.assert_forgery_fails("typing.pyc", &completion);
}

#[test]
fn module_shadowing_random_py_imported_by_the_tests() {
    let task = Task {
        prompt: "def double(x):\n",
        tests: "import random\n\ndef check(candidate):\n    for _ in range(5):\n        x = random.randint(0, 100)\n        assert candidate(x) == 2 * x\n",
        entry_point: "double",
        honest_body: "    return 2 * x\n",
    };
    task.assert_forgery_fails("random.py", &writes("random.py", JUDGE_PAYLOAD));
}

#[test]
fn module_shadowing_heapq_imported_lazily_by_counter_most_common() {
    let task = Task {
        prompt: "def letters(s):\n",
        tests: "from collections import Counter\n\ndef check(candidate):\n    assert Counter(candidate('abca')).most_common(1)[0] == ('a', 2)\n",
        entry_point: "letters",
        honest_body: "    return list(s)\n",
    };
    task.assert_forgery_fails("heapq.py", &writes("heapq.py", JUDGE_PAYLOAD));
}

#[test]
fn module_shadowing_linecache_imported_when_a_syntax_warning_is_shown() {
    // `x is 1` makes the compiler emit a SyntaxWarning; showing it imports linecache.
    let task = Task {
        prompt: "def one():\n",
        tests: "def check(candidate):\n    x = candidate()\n    assert x is 1 or x == 1\n",
        entry_point: "one",
        honest_body: "    return 1\n",
    };
    task.assert_forgery_fails("linecache.py", &writes("linecache.py", JUDGE_PAYLOAD));
}

#[test]
fn module_shadowing_every_stdlib_name_at_once() {
    for (mechanism, completion) in [
        ("all .py", forgers::shadow_modules_py()),
        ("all packages", forgers::shadow_modules_package()),
        ("all .pyc", forgers::shadow_modules_pyc()),
    ] {
        TYPED.assert_forgery_fails(mechanism, &completion);
    }
}

/// Tests whose iteration ends early when the candidate's exception is re-raised as itself.
const PAIRS_TESTS: [&str; 4] = [
    "def check(candidate):\n    pairs = [(1, 1), (2, 4), (3, 9)]\n    assert all(map(lambda p: candidate(p[0]) == p[1], pairs))\n",
    "def check(candidate):\n    pairs = [(1, 1), (2, 4), (3, 9)]\n    assert not any(map(lambda p: candidate(p[0]) != p[1], pairs))\n",
    "def check(candidate):\n    assert all(got == want for got, want in zip(map(candidate, [1, 2, 3]), [1, 4, 9]))\n",
    "def check(candidate):\n    assert list(map(candidate, [1, 2, 3])) == [1, 4, 9] or not list(map(candidate, [1, 2, 3]))\n",
];

#[test]
fn stop_iteration_from_the_candidate_does_not_end_the_judges_iteration() {
    for tests in PAIRS_TESTS {
        let task = Task {
            prompt: "def square(x):\n",
            tests,
            entry_point: "square",
            honest_body: "    return x * x\n",
        };
        task.assert_forgery_fails("StopIteration", &forgers::stop_iteration());
        task.assert_forgery_fails("StopAsyncIteration", &forgers::stop_async_iteration());
    }
}

#[test]
fn stop_iteration_from_a_generator_or_iterator_result_is_a_failure() {
    let task = Task {
        prompt: "def square(x):\n",
        tests: PAIRS_TESTS[0],
        entry_point: "square",
        honest_body: "    return x * x\n",
    };
    for body in [
        "    next(iter([]))\n",
        "    raise StopIteration(4)\n",
        "    class StopIteration(Exception):\n        pass\n    raise StopIteration\n",
    ] {
        task.assert_forgery_fails(body.trim(), body);
    }
}

#[test]
fn exceptions_still_cross_as_data_the_tests_can_check() {
    let task = Task {
        prompt: "def root(x):\n",
        tests: "def check(candidate):\n    try:\n        candidate(-1)\n        raised = False\n    except ValueError:\n        raised = True\n    assert raised\n    try:\n        candidate(None)\n        typed = False\n    except TypeError:\n        typed = True\n    assert typed\n    assert candidate(4) == 2\n",
        entry_point: "root",
        honest_body: "    if x < 0:\n        raise ValueError('negative')\n    return int(x ** 0.5)\n",
    };
    // An exception type that needs constructor arguments still arrives as a failure, not a
    // crash of the judge.
    task.assert_forgery_fails(
        "UnicodeDecodeError",
        "    raise UnicodeDecodeError('utf-8', b'x', 0, 1, 'bad')\n",
    );
    task.assert_forgery_fails("StopIteration", &forgers::stop_iteration());
}

#[test]
fn objects_that_equal_everything() {
    TYPED.assert_forgery_fails("always-equal", &forgers::always_equal());
    for body in [
        "    class E:\n        __eq__ = lambda s, o: True\n    return E()\n",
        "    class E(dict):\n        __eq__ = lambda s, o: True\n    return E()\n",
        "    class E(float):\n        __eq__ = lambda s, o: True\n    return E('nan')\n",
        "    class M(type):\n        __eq__ = lambda s, o: True\n    return M('X', (), {})\n",
        "    import unittest.mock\n    return unittest.mock.ANY\n",
        "    return NotImplemented\n",
        "    return Ellipsis\n",
    ] {
        TYPED.assert_forgery_fails(body.trim(), body);
    }
}

#[test]
fn forged_report_output_on_any_descriptor() {
    TYPED.assert_forgery_fails(
        "every descriptor",
        &forgers::forged_report_on_every_descriptor(),
    );
    // Through the judge's descriptors in /proc, and from a daemon that outlives the solution.
    TYPED.assert_forgery_fails(
        "/proc/ppid/fd",
        "    return -1\nimport os as _os\nfor _fd in range(0, 8):\n    try:\n        _w = _os.open('/proc/%d/fd/%d' % (_os.getppid(), _fd), _os.O_WRONLY)\n        _os.write(_w, b'\\nstoke-0 1 1 ok\\n')\n    except OSError:\n        pass\n",
    );
    TYPED.assert_forgery_fails(
        "daemon stealing the report",
        "    return -1\nimport os as _os, time as _t\nif _os.fork() == 0:\n    try:\n        _os.setpgid(0, 0)\n    except OSError:\n        pass\n    for _ in range(100):\n        for _fd in range(0, 4):\n            try:\n                _r = _os.open('/proc/%d/fd/1' % _os.getppid(), _os.O_RDONLY | _os.O_NONBLOCK)\n                _d = _os.read(_r, 4096)\n                if b'stoke-' in _d:\n                    _n = _d.split()[0].decode()\n                    _os.write(_r, ('\\n%s 1 1 ok\\n' % _n).encode())\n            except OSError:\n                pass\n        _t.sleep(0.01)\n    _os._exit(0)\n",
    );
}

#[test]
fn tampering_with_the_interpreter_state() {
    TYPED.assert_forgery_fails(
        "builtins/sys.modules/atexit/__del__",
        &forgers::interpreter_tampering(),
    );
    for body in [
        "    import sys\n    sys.modules.clear()\n    return -1\n",
        "    import builtins\n    builtins.__dict__.clear()\n    return -1\n",
        "    import gc\n    for o in gc.get_objects():\n        if type(o) is set:\n            o.update(range(8))\n    return -1\n",
    ] {
        TYPED.assert_forgery_fails(body.trim(), body);
    }
}

#[test]
fn signals_sent_to_the_judge() {
    TYPED.assert_forgery_fails("signals", &forgers::signals_to_the_judge());
}

#[test]
fn writes_to_the_judges_files_after_it_started() {
    // The judge read its files before the solution started; rewriting them changes nothing.
    TYPED.assert_forgery_fails(
        "rewritten tests and harness files",
        "    return -1\nfor _n in ('tests.py', 'prompt.py', 'child.py', 'main.py'):\n    with open(_n, 'w') as _f:\n        _f.write('def check(candidate):\\n    pass\\n')\n",
    );
}

#[test]
fn stdio_tests_forgeries_score_zero() {
    let verifier = StdioTestsVerifier::new(&StdioTestsConfig::default(), sandbox()).unwrap();
    let reference = Reference {
        cases: Some(vec![
            IoCase {
                input: "2 3\n".into(),
                output: "5\n".into(),
            },
            IoCase {
                input: "10 -4\n".into(),
                output: "6\n".into(),
            },
        ]),
        ..Reference::default()
    };
    let score = |code: &str| verifier.score(&RewardInput::new("add", code, &reference));
    let honest = score("a, b = map(int, input().split())\nprint(a + b)\n");
    assert_eq!(honest.outcome, Outcome::Correct, "{honest:?}");
    for (mechanism, code) in [
        ("constant guess", "print(5)\n"),
        ("exit 0 without output", "import os\nos._exit(0)\n"),
        (
            "answers left by a concurrent run",
            "import glob\nfor p in glob.glob('/tmp/**/answer*', recursive=True):\n    print(open(p).read())\nopen('answer', 'w').write('5')\nprint(5)\n",
        ),
        (
            "shadowed module then exit",
            "open('typing.py', 'w').write('print(6)')\nprint(5)\n",
        ),
    ] {
        let outcome = score(code);
        assert_ne!(
            outcome.outcome,
            Outcome::Correct,
            "{mechanism}: {outcome:?}"
        );
        assert!(outcome.score < 1.0, "{mechanism}: {outcome:?}");
    }
}

#[test]
fn a_relay_cannot_copy_a_concurrent_siblings_answer_through_host_file_locks() {
    // Found by the red-team: the sender (honest) encodes its answer as locks on 16 shared
    // system files, the relay (which never computes) reads them back with non-blocking lock
    // attempts. The two run at once as one group.
    let sender = "def square(x):\n    r = x * x\n    import fcntl, os, glob, time\n    files = sorted(set(os.path.realpath(f) for f in glob.glob('/usr/lib/python3*/*.py')))[:16]\n    held = []\n    for i, f in enumerate(files):\n        if r >> i & 1:\n            fd = os.open(f, os.O_RDONLY)\n            try:\n                fcntl.flock(fd, fcntl.LOCK_EX)\n            except OSError:\n                pass\n            held.append(fd)\n    time.sleep(0.6)\n    for fd in held:\n        os.close(fd)\n    time.sleep(0.2)\n    return r\n";
    let relay = "def square(x):\n    import fcntl, os, glob, time\n    files = sorted(set(os.path.realpath(f) for f in glob.glob('/usr/lib/python3*/*.py')))[:16]\n    time.sleep(0.3)\n    v = 0\n    for i, f in enumerate(files):\n        fd = os.open(f, os.O_RDONLY)\n        try:\n            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)\n        except BlockingIOError:\n            v |= 1 << i\n        except OSError:\n            pass\n        os.close(fd)\n    time.sleep(0.5)\n    return v\n";
    let reference = Reference {
        tests: Some(
            "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"
                .into(),
        ),
        entry_point: Some("square".into()),
        ..Reference::default()
    };
    let prompt = "def square(x):\n";
    let sender_text = format!("```python\n{sender}```");
    let relay_text = format!("```python\n{relay}```");
    let outcomes = unit_tests().score_group(&[
        RewardInput::new(prompt, &sender_text, &reference),
        RewardInput::new(prompt, &relay_text, &reference),
    ]);
    assert_eq!(outcomes[0].outcome, Outcome::Correct, "{:?}", outcomes[0]);
    assert_eq!(
        outcomes[1].score, 0.0,
        "the relay copied the answer: {:?}",
        outcomes[1]
    );
}
