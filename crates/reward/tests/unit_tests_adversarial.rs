//! Reward hacks against the unit-test reward: each completion below tries to score without
//! solving the task (square a number) by tampering with the harness from inside the program.
//! Every one must score 0; an honest solution must still score 1.

use stoke_reward::unit_tests::{UnitTestsConfig, UnitTestsVerifier};
use stoke_reward::{Outcome, Reference, RewardInput, RewardOutcome, Verifier};
use stoke_sandbox::{IsolationLevel, Sandbox, SandboxConfig};

const PROMPT: &str = "def square(x):\n";

fn reference() -> Reference {
    Reference {
        tests: Some(
            "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n    assert abs(candidate(-1.5) - 2.25) < 1e-9\n"
                .into(),
        ),
        entry_point: Some("square".into()),
        ..Reference::default()
    }
}

fn verifier() -> UnitTestsVerifier {
    let config = SandboxConfig {
        min_isolation: IsolationLevel::Basic,
        workers: 4,
        ..SandboxConfig::default()
    };
    UnitTestsVerifier::new(&UnitTestsConfig::default(), Sandbox::new(config).unwrap()).unwrap()
}

fn score(completion: &str) -> RewardOutcome {
    verifier().score(&RewardInput::new(PROMPT, completion, &reference()))
}

/// A full definition that returns a wrong answer, after `preamble` ran at module level.
fn wrong_after(preamble: &str) -> String {
    format!("```python\n{preamble}\ndef square(x):\n    return 0\n```")
}

fn assert_unrewarded(completion: &str) {
    let outcome = score(completion);
    assert_eq!(outcome.score, 0.0, "hack was rewarded: {outcome:?}");
    assert_ne!(outcome.outcome, Outcome::Correct, "{outcome:?}");
}

#[test]
fn unit_tests_honest_solution_still_passes() {
    let outcome = score("    return x * x\n");
    assert_eq!(
        (outcome.outcome, outcome.score),
        (Outcome::Correct, 1.0),
        "{outcome:?}"
    );
    assert_eq!(
        (outcome.details.passed, outcome.details.total),
        (Some(3), Some(3))
    );
}

#[test]
fn unit_tests_rejects_solution_that_reads_nonce_from_stdin() {
    assert_unrewarded(&wrong_after(
        "import sys, os\nn = sys.stdin.read().strip() or 'stoke-0'\nos.write(1, ('\\n%s 3 3 ok\\n' % n).encode())\nos._exit(0)",
    ));
}

#[test]
fn unit_tests_rejects_solution_that_reads_nonce_from_harness_frame() {
    assert_unrewarded(&wrong_after(
        "import sys, os\nf = sys._getframe(1)\nwhile f is not None and 'nonce' not in f.f_locals:\n    f = f.f_back\nv = f.f_locals\nos.write(v.get('result_fd', 1), ('\\n%s %d %d ok\\n' % (v['nonce'], v['total'], v['total'])).encode())\nos._exit(0)",
    ));
}

#[test]
fn unit_tests_rejects_solution_that_rebinds_the_assertion_failure_counter() {
    assert_unrewarded(&wrong_after("_stoke_bad_ = _stoke_ok_"));
}

#[test]
fn unit_tests_rejects_solution_that_fills_the_pass_set_via_gc() {
    assert_unrewarded(&wrong_after(
        "import gc\nfor o in gc.get_objects():\n    if type(o) is set and len(o) == 0:\n        try:\n            o.update(range(3))\n        except Exception:\n            pass\n",
    ));
}

#[test]
fn unit_tests_rejects_solution_that_patches_builtins() {
    // `abs` patched to always return 0, `len` to lie, `type` to defeat an exact type check.
    assert_unrewarded(&wrong_after(
        "import builtins\nbuiltins.abs = lambda v: 0\nbuiltins.len = lambda v: 3\n_t = builtins.type\nclass _T:\n    pass\n",
    ));
}

#[test]
fn unit_tests_rejects_solution_that_patches_os_write() {
    assert_unrewarded(&wrong_after(
        "import os\n_w = os.write\ndef _forge(fd, data):\n    parts = data.split(b' ')\n    if len(parts) >= 4:\n        parts[1] = parts[2]\n        data = b' '.join(parts).replace(b'check_raised', b'ok')\n    return _w(fd, data)\nos.write = _forge",
    ));
}

#[test]
fn unit_tests_rejects_solution_that_traces_the_harness() {
    assert_unrewarded(&wrong_after(
        "import sys\ndef _tr(frame, event, arg):\n    if event == 'call' and frame.f_code.co_name == 'report':\n        frame.f_locals['passed'] = frame.f_locals['total']\n    return _tr\nsys.settrace(_tr)\n",
    ));
}

#[test]
fn unit_tests_rejects_int_subclass_with_always_true_eq() {
    assert_unrewarded(&wrong_after(
        "class X(int):\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n    __sub__ = lambda s, o: 0\ndef square(x):\n    return X(0)\nsquare_real = square",
    ));
    assert_unrewarded(
        "```python\nclass X(int):\n    __eq__ = lambda s, o: True\n    __sub__ = lambda s, o: 0\ndef square(x):\n    return X(0)\n```",
    );
    assert_unrewarded(
        "```python\nclass S(str):\n    __eq__ = lambda s, o: True\ndef square(x):\n    return S('')\n```",
    );
    assert_unrewarded(
        "```python\nclass L(list):\n    __eq__ = lambda s, o: True\ndef square(x):\n    return L()\n```",
    );
}

#[test]
fn unit_tests_rejects_solution_that_raises_base_exceptions() {
    for exception in [
        "SystemExit(0)",
        "KeyboardInterrupt()",
        "BaseException()",
        "GeneratorExit()",
    ] {
        assert_unrewarded(&format!("    raise {exception}\n"));
    }
}

#[test]
fn unit_tests_rejects_solution_that_exits_inside_the_function() {
    for exit in [
        "import sys; sys.exit(0)",
        "import os; os._exit(0)",
        "exit()",
        "import atexit, os; atexit.register(lambda: os.write(1, b'ok')); raise SystemExit",
    ] {
        assert_unrewarded(&format!("    {exit}\n"));
    }
}

#[test]
fn unit_tests_rejects_solution_that_swaps_check_or_candidate() {
    // Module-level code cannot reach the namespace the tests run in.
    assert_unrewarded(&wrong_after(
        "import builtins\nbuiltins.check = lambda c: None\ncandidate = lambda x: x * x\n",
    ));
    // Redefining `check` in the solution: the tests define their own.
    assert_unrewarded(
        "```python\ndef check(candidate):\n    pass\ndef square(x):\n    return 0\n```",
    );
}

#[test]
fn unit_tests_rejects_solution_that_replays_answers_from_the_tests_file() {
    // Parses `assert candidate(2) == 4` lines out of tests.py and answers by lookup.
    assert_unrewarded(
        "```python\nimport re\ntry:\n    _table = {float(a): float(b) for a, b in re.findall(r'candidate\\((-?[0-9.]+)\\) == (-?[0-9.]+)', open('tests.py').read())}\nexcept OSError:\n    _table = {}\ndef square(x):\n    return _table.get(x, 0)\n```",
    );
}

#[test]
fn unit_tests_exceptions_cross_as_their_builtin_class() {
    let reference = Reference {
        tests: Some(
            "def check(candidate):\n    try:\n        candidate(-1)\n        raised = False\n    except ValueError:\n        raised = True\n    assert raised\n    assert candidate(4) == (2, 'two', [2.0], {2: b'2'})\n"
                .into(),
        ),
        entry_point: Some("root".into()),
        ..Reference::default()
    };
    let completion = "    if x < 0:\n        raise ValueError('negative')\n    return (2, 'two', [2.0], {2: b'2'})\n";
    let outcome = verifier().score(&RewardInput::new("def root(x):\n", completion, &reference));
    assert_eq!(outcome.outcome, Outcome::Correct, "{outcome:?}");
}

#[test]
fn unit_tests_rejects_solution_that_reads_the_judge_memory_and_kills_it() {
    // Scans the judge's memory through /proc for the nonce, writes a forged report to the
    // judge's stdout through /proc/<ppid>/fd/1, then kills the judge so its real report never
    // comes. The judge makes itself non-dumpable, so /proc refuses both.
    assert_unrewarded(&wrong_after(
        r#"import os, re, signal
ppid = os.getppid()
found = None
try:
    mem = open('/proc/%d/mem' % ppid, 'rb')
    for line in open('/proc/%d/maps' % ppid).read().splitlines():
        fields = line.split()
        if 'r' not in fields[1]:
            continue
        start, end = [int(x, 16) for x in fields[0].split('-')]
        try:
            mem.seek(start)
            data = mem.read(end - start)
        except Exception:
            continue
        match = re.search(rb'stoke-[0-9a-f]{32}', data)
        if match:
            found = match.group().decode()
            break
except Exception as error:
    os.write(2, ('mem: %r\n' % error).encode())
try:
    out = os.open('/proc/%d/fd/1' % ppid, os.O_WRONLY)
    os.write(out, ('\n%s 3 3 ok\n' % found).encode())
    os.kill(ppid, signal.SIGKILL)
except Exception as error:
    os.write(2, ('fd: %r\n' % error).encode())
"#,
    ));
}
