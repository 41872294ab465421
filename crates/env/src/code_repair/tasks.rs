//! The code-repair task generator: small Python repositories with planted bugs.
//!
//! What it is: a handful of [`Template`]s (one function each: `sum_to`, `is_palindrome`,
//! `clamp`, `count_vowels`, `fizzbuzz`, `max_of`, `distance`), each with its correct source, a
//! few bugs (a line replaced: an off-by-one loop bound, a wrong comparison or arithmetic
//! operator, swapped return values, a missing `abs` or `lower()`), inputs that reveal each bug,
//! and a Rust reference implementation that computes every expected value. A task draws a
//! template, one or two bugs on distinct lines, and random inputs; it is an [`EnvTask`] whose
//! `data` holds:
//! - `files`: the repository (`<name>.py` with the bugs, `tests/test_<name>.py` with visible
//!   `test_*` functions of plain `assert`s, and `run_tests.py`, the runner);
//! - `hidden_tests`: `check(candidate)` over more inputs (HumanEval style), never written into
//!   the workspace;
//! - `module`, `entry_point`: the file and function under repair;
//! - `solution`: the fixed module text, for tests of the generator only (never shown to the
//!   model).
//!
//! What it is not: the tools or the environment (`tools.rs`, `code_repair.rs`), or a judge of
//! the repair (the environment's `finish` runs the hidden tests).
//!
//! Invariants: tasks are deterministic in (spec, index); the visible tests include an input
//! revealing each planted bug, and the hidden tests every revealing input of the template (plus
//! random inputs), so both fail on the generated module and pass on the solution (the sandbox
//! suite `tests/code_repair.rs` checks it). Expected values come from the Rust reference, never
//! from running the solution.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use crate::environment::EnvTask;
use crate::error::EnvError;

/// The runner of the visible tests, `run_tests.py` in every repository: imports each
/// `tests/test_*.py`, calls its `test_*` functions in order and prints one line per test and a
/// `N passed, M failed` summary; exits 1 when a test failed.
pub const RUN_TESTS_PY: &str = r#""""Runs every test_* function of tests/test_*.py: python3 run_tests.py"""
import sys

sys.dont_write_bytecode = True
import glob
import importlib.util
import os
import traceback


def main():
    sys.path.insert(0, os.getcwd())
    passed = failed = 0
    for path in sorted(glob.glob(os.path.join("tests", "test_*.py"))):
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            failed += 1
            print("ERROR %s: %s: %s" % (path, type(error).__name__, error))
            continue
        for test_name, test in list(vars(module).items()):
            if not test_name.startswith("test_") or not callable(test):
                continue
            try:
                test()
            except Exception as error:
                failed += 1
                frames = traceback.extract_tb(error.__traceback__)
                line = frames[-1].line if frames else ""
                print("FAIL %s::%s: %s %s" % (path, test_name, type(error).__name__, line or error))
            else:
                passed += 1
                print("PASS %s::%s" % (path, test_name))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
"#;

/// How the tasks are drawn.
#[derive(Clone, Debug, PartialEq)]
pub struct CodeRepairSpec {
    pub seed: u64,
    /// Bugs planted per task: each task draws 1..=`max_bugs` (1 or 2).
    pub max_bugs: usize,
    /// The [`Template`] names tasks are drawn from; empty: all of them.
    pub templates: Vec<String>,
}

impl Default for CodeRepairSpec {
    fn default() -> Self {
        CodeRepairSpec {
            seed: 0,
            max_bugs: 2,
            templates: Vec::new(),
        }
    }
}

impl CodeRepairSpec {
    /// Checks `max_bugs` and the template names; the error names the field.
    pub fn check(&self) -> Result<(), EnvError> {
        if !(1..=2).contains(&self.max_bugs) {
            return Err(EnvError::config(
                "max_bugs",
                format!("must be 1 or 2, got {}", self.max_bugs),
            ));
        }
        if let Some(unknown) = self
            .templates
            .iter()
            .find(|name| !TEMPLATES.iter().any(|t| t.name == name.as_str()))
        {
            let known: Vec<&str> = TEMPLATES.iter().map(|t| t.name).collect();
            return Err(EnvError::config(
                "templates",
                format!("unknown template `{unknown}` (known: {})", known.join(", ")),
            ));
        }
        Ok(())
    }
}

/// `count` tasks from `spec`; task `i` depends only on (seed, max_bugs, templates, i).
pub fn code_repair_tasks(spec: &CodeRepairSpec, count: usize) -> Result<Vec<EnvTask>, EnvError> {
    spec.check()?;
    Ok((0..count).map(|index| task(spec, index as u64)).collect())
}

/// One planted bug: lines of the correct source (0-based) replaced by other text.
#[derive(Clone, Copy, Debug)]
pub struct Bug {
    pub what: &'static str,
    pub lines: &'static [(usize, &'static str)],
    /// Argument lists (Python literals) on which the bug changes the result, alone or planted
    /// beside any other bug of its template on other lines: the first goes to the visible tests
    /// when the bug is planted; the hidden tests hold both of every bug of the template.
    pub reveals: [&'static str; 2],
}

/// A function to repair.
#[derive(Clone, Copy, Debug)]
pub struct Template {
    pub name: &'static str,
    pub source: &'static str,
    pub bugs: &'static [Bug],
    /// A random argument list (Python literal arguments, comma-separated).
    pub draw: fn(&mut ChaCha8Rng) -> String,
    /// The expected result of the argument list, as a Python literal.
    pub expected: fn(&str) -> String,
}

/// The templates tasks are drawn from.
pub fn templates() -> &'static [Template] {
    &TEMPLATES
}

fn task(spec: &CodeRepairSpec, index: u64) -> EnvTask {
    let mut rng =
        ChaCha8Rng::seed_from_u64(spec.seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xC0DE);
    // Without a filter the draw is over every template (the stream of unfiltered specs).
    let template = if spec.templates.is_empty() {
        &TEMPLATES[rng.random_range(0..TEMPLATES.len())]
    } else {
        let name = &spec.templates[rng.random_range(0..spec.templates.len())];
        TEMPLATES
            .iter()
            .find(|t| t.name == name.as_str())
            .expect("checked by CodeRepairSpec::check")
    };
    let first = rng.random_range(0..template.bugs.len());
    let mut planted = vec![first];
    if spec.max_bugs >= 2 && rng.random_bool(0.5) {
        let free: Vec<usize> = (0..template.bugs.len())
            .filter(|&other| {
                template.bugs[other].lines.iter().all(|(line, _)| {
                    template.bugs[first]
                        .lines
                        .iter()
                        .all(|(taken, _)| taken != line)
                })
            })
            .collect();
        if !free.is_empty() {
            planted.push(free[rng.random_range(0..free.len())]);
        }
    }
    planted.sort_unstable();
    build(
        format!("code_repair-{}-{index}", spec.seed),
        template,
        &planted,
        &mut rng,
    )
}

/// The task with `planted` (indices into `template.bugs`, on distinct lines) and random inputs
/// drawn from `seed`: every variant the generator can draw, for tests that cover them all.
pub fn variant(template: &Template, planted: &[usize], seed: u64) -> EnvTask {
    build(
        format!("code_repair-{}-{planted:?}-{seed}", template.name),
        template,
        planted,
        &mut ChaCha8Rng::seed_from_u64(seed),
    )
}

fn build(id: String, template: &Template, planted: &[usize], rng: &mut ChaCha8Rng) -> EnvTask {
    let name = template.name;
    let module = format!("{name}.py");
    let test_path = format!("tests/test_{name}.py");

    let mut visible: Vec<String> = planted
        .iter()
        .map(|&bug| template.bugs[bug].reveals[0].to_string())
        .collect();
    visible.extend((0..2).map(|_| (template.draw)(rng)));
    let mut hidden: Vec<String> = template
        .bugs
        .iter()
        .flat_map(|bug| bug.reveals.map(str::to_string))
        .collect();
    hidden.extend((0..6).map(|_| (template.draw)(rng)));

    let mut visible_tests = format!("from {name} import {name}\n");
    for (number, args) in visible.iter().enumerate() {
        visible_tests.push_str(&format!(
            "\n\ndef test_{name}_{}():\n    assert {name}({args}) == {}\n",
            number + 1,
            (template.expected)(args)
        ));
    }
    let mut hidden_tests = String::from("def check(candidate):\n");
    for args in &hidden {
        hidden_tests.push_str(&format!(
            "    assert candidate({args}) == {}\n",
            (template.expected)(args)
        ));
    }

    let files: BTreeMap<String, Value> = [
        (module.clone(), json!(buggy_source(template, planted))),
        (test_path.clone(), json!(visible_tests)),
        ("run_tests.py".to_string(), json!(RUN_TESTS_PY)),
    ]
    .into_iter()
    .collect();
    let prompt = match rng.random_range(0..3) {
        0 => format!("The tests in {test_path} fail. Fix {module}."),
        1 => format!(
            "`python3 run_tests.py` reports failures in {test_path}. Find the bug in {module} \
             and fix it; don't change the tests."
        ),
        _ => format!(
            "{name}() in {module} gives wrong results; the tests in {test_path} show it. Please fix it."
        ),
    };
    let bugs: Vec<&str> = planted.iter().map(|&bug| template.bugs[bug].what).collect();
    EnvTask {
        id,
        prompt,
        data: [
            (
                "files".to_string(),
                Value::Object(files.into_iter().collect()),
            ),
            ("hidden_tests".to_string(), json!(hidden_tests)),
            ("module".to_string(), json!(module)),
            ("entry_point".to_string(), json!(name)),
            (
                "solution".to_string(),
                json!(format!("{}\n", template.source)),
            ),
            ("bugs".to_string(), json!(bugs)),
        ]
        .into_iter()
        .collect(),
        ..EnvTask::default()
    }
}

/// The template's source with the bugs' lines replaced.
pub fn buggy_source(template: &Template, planted: &[usize]) -> String {
    // Bugs replace whole lines; two bugs never share one (the draw keeps them apart).
    let mut lines: Vec<String> = template.source.lines().map(str::to_string).collect();
    for &bug in planted {
        for &(line, text) in template.bugs[bug].lines {
            lines[line] = text.to_string();
        }
    }
    lines.join("\n") + "\n"
}

/// Python literal arguments parsed as JSON (the templates' arguments are ints, strings and
/// lists of ints, written the same in both).
fn args(text: &str) -> Vec<Value> {
    serde_json::from_str::<Vec<Value>>(&format!("[{text}]")).unwrap_or_default()
}

fn int(value: &Value) -> i64 {
    value.as_i64().unwrap_or_default()
}

fn string(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

fn py_bool(value: bool) -> String {
    if value { "True" } else { "False" }.to_string()
}

fn letters(rng: &mut ChaCha8Rng, alphabet: &[u8], length: usize) -> String {
    (0..length)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect()
}

const TEMPLATES: [Template; 7] = [
    Template {
        name: "sum_to",
        source: "def sum_to(n):\n    total = 0\n    for i in range(1, n + 1):\n        total += i\n    return total",
        bugs: &[
            Bug {
                what: "off-by-one loop bound",
                lines: &[(2, "    for i in range(1, n):")],
                reveals: ["3", "10"],
            },
            Bug {
                what: "wrong arithmetic operator",
                lines: &[(3, "        total -= i")],
                reveals: ["4", "7"],
            },
        ],
        draw: |rng| rng.random_range(0..=30).to_string(),
        expected: |text| {
            let n = int(&args(text)[0]);
            (n.max(0) * (n.max(0) + 1) / 2).to_string()
        },
    },
    Template {
        name: "is_palindrome",
        source: "def is_palindrome(s):\n    s = s.lower()\n    for i in range(len(s) // 2):\n        if s[i] != s[len(s) - 1 - i]:\n            return False\n    return True",
        bugs: &[
            Bug {
                what: "missing case folding",
                lines: &[(1, "    s = s")],
                reveals: ["\"Abba\"", "\"RaceCar\""],
            },
            Bug {
                what: "swapped return values",
                lines: &[(4, "            return True"), (5, "    return False")],
                reveals: ["\"abc\"", "\"level\""],
            },
            Bug {
                what: "off-by-one index",
                lines: &[(3, "        if s[i] != s[len(s) - 2 - i]:")],
                reveals: ["\"noon\"", "\"abcba\""],
            },
        ],
        draw: |rng| {
            let length = rng.random_range(1..=3);
            let half = letters(rng, b"abcAB", length);
            if rng.random_bool(0.5) {
                let mirrored: String = half.chars().rev().collect();
                format!("\"{half}{mirrored}\"")
            } else {
                // The last letter is never one of the first's: not a palindrome.
                let length = rng.random_range(1..=3);
                format!("\"{half}{}\"", letters(rng, b"xyzXY", length))
            }
        },
        expected: |text| {
            let s = string(&args(text)[0]).to_ascii_lowercase();
            py_bool(s.chars().eq(s.chars().rev()))
        },
    },
    Template {
        name: "clamp",
        source: "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x",
        bugs: &[
            Bug {
                what: "wrong comparison operator",
                lines: &[(1, "    if x > lo:")],
                reveals: ["5, 0, 10", "3, -2, 8"],
            },
            Bug {
                what: "wrong return value",
                lines: &[(4, "        return lo")],
                reveals: ["15, 0, 10", "9, -3, 4"],
            },
            Bug {
                what: "inverted comparison",
                lines: &[(3, "    if x < hi:")],
                reveals: ["7, 0, 10", "-1, -5, 5"],
            },
        ],
        draw: |rng| {
            let lo = rng.random_range(-10..0);
            let hi = rng.random_range(1..10);
            format!("{}, {lo}, {hi}", rng.random_range(-20..=20))
        },
        expected: |text| {
            let values = args(text);
            let (x, lo, hi) = (int(&values[0]), int(&values[1]), int(&values[2]));
            x.max(lo).min(hi).to_string()
        },
    },
    Template {
        name: "count_vowels",
        source: "def count_vowels(s):\n    count = 0\n    for ch in s.lower():\n        if ch in \"aeiou\":\n            count += 1\n    return count",
        bugs: &[
            Bug {
                what: "missing case folding",
                lines: &[(2, "    for ch in s:")],
                reveals: ["\"AEIOU\"", "\"Orange Apple\""],
            },
            Bug {
                what: "inverted membership test",
                lines: &[(3, "        if ch not in \"aeiou\":")],
                reveals: ["\"hello\"", "\"banana\""],
            },
            Bug {
                what: "wrong increment",
                lines: &[(4, "            count += 2")],
                reveals: ["\"cat\"", "\"queue\""],
            },
        ],
        draw: |rng| {
            let length = rng.random_range(0..=10);
            format!("\"{}\"", letters(rng, b"abeioruxyzAEU", length))
        },
        expected: |text| {
            let s = string(&args(text)[0]).to_ascii_lowercase();
            s.chars()
                .filter(|c| "aeiou".contains(*c))
                .count()
                .to_string()
        },
    },
    Template {
        name: "fizzbuzz",
        source: "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n        if i % 15 == 0:\n            out.append(\"FizzBuzz\")\n        elif i % 3 == 0:\n            out.append(\"Fizz\")\n        elif i % 5 == 0:\n            out.append(\"Buzz\")\n        else:\n            out.append(str(i))\n    return out",
        bugs: &[
            Bug {
                what: "off-by-one loop bound",
                lines: &[(2, "    for i in range(1, n):")],
                reveals: ["2", "16"],
            },
            Bug {
                what: "swapped results",
                lines: &[
                    (6, "            out.append(\"Buzz\")"),
                    (8, "            out.append(\"Fizz\")"),
                ],
                reveals: ["5", "9"],
            },
            Bug {
                what: "wrong divisor",
                lines: &[(3, "        if i % 10 == 0:")],
                reveals: ["10", "15"],
            },
        ],
        draw: |rng| rng.random_range(0..=20).to_string(),
        expected: |text| {
            let n = int(&args(text)[0]);
            let items: Vec<String> = (1..=n)
                .map(|i| match (i % 3, i % 5) {
                    (0, 0) => "\"FizzBuzz\"".to_string(),
                    (0, _) => "\"Fizz\"".to_string(),
                    (_, 0) => "\"Buzz\"".to_string(),
                    _ => format!("\"{i}\""),
                })
                .collect();
            format!("[{}]", items.join(", "))
        },
    },
    Template {
        name: "max_of",
        source: "def max_of(xs):\n    if not xs:\n        return None\n    best = xs[0]\n    for x in xs[1:]:\n        if x > best:\n            best = x\n    return best",
        bugs: &[
            Bug {
                what: "wrong comparison operator",
                lines: &[(5, "        if x < best:")],
                reveals: ["[1, 3, 2]", "[4, 9, 7, 1]"],
            },
            Bug {
                what: "wrong start value",
                lines: &[(3, "    best = 0")],
                reveals: ["[-3, -1, -2]", "[-8, -5]"],
            },
            Bug {
                what: "off-by-one slice",
                lines: &[(4, "    for x in xs[1:-1]:")],
                reveals: ["[1, 2, 5]", "[0, 3, 4, 8]"],
            },
            Bug {
                what: "missing empty-list case",
                lines: &[(2, "        return 0")],
                reveals: ["[]", "[]"],
            },
        ],
        draw: |rng| {
            let length = rng.random_range(1..=6);
            let items: Vec<String> = (0..length)
                .map(|_| rng.random_range(-50..=50).to_string())
                .collect();
            format!("[{}]", items.join(", "))
        },
        expected: |text| {
            let values = args(text);
            let items: Vec<i64> = values[0]
                .as_array()
                .map(|xs| xs.iter().map(int).collect())
                .unwrap_or_default();
            items
                .iter()
                .max()
                .map_or("None".to_string(), |max| max.to_string())
        },
    },
    Template {
        name: "distance",
        source: "def distance(a, b):\n    return abs(a - b)",
        bugs: &[
            Bug {
                what: "missing abs",
                lines: &[(1, "    return a - b")],
                reveals: ["2, 9", "-4, 3"],
            },
            Bug {
                what: "wrong arithmetic operator",
                lines: &[(1, "    return abs(a + b)")],
                reveals: ["7, 3", "-6, -1"],
            },
        ],
        draw: |rng| {
            format!(
                "{}, {}",
                rng.random_range(-20..=20),
                rng.random_range(-20..=20)
            )
        },
        expected: |text| {
            let values = args(text);
            (int(&values[0]) - int(&values[1])).abs().to_string()
        },
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bug_replaces_lines_of_its_template() {
        for template in templates() {
            let lines: Vec<&str> = template.source.lines().collect();
            for (index, bug) in template.bugs.iter().enumerate() {
                for &(line, text) in bug.lines {
                    assert!(line < lines.len(), "{}: {}", template.name, bug.what);
                    assert_ne!(lines[line], text, "{}: {}", template.name, bug.what);
                }
                assert_ne!(
                    buggy_source(template, &[index]),
                    format!("{}\n", template.source)
                );
            }
        }
    }

    #[test]
    fn expected_values_follow_the_reference_implementations() {
        let by_name = |name: &str| templates().iter().find(|t| t.name == name).unwrap();
        assert_eq!((by_name("sum_to").expected)("4"), "10");
        assert_eq!((by_name("is_palindrome").expected)("\"Abba\""), "True");
        assert_eq!((by_name("clamp").expected)("15, 0, 10"), "10");
        assert_eq!((by_name("count_vowels").expected)("\"Orange Apple\""), "5");
        assert_eq!(
            (by_name("fizzbuzz").expected)("5"),
            "[\"1\", \"2\", \"Fizz\", \"4\", \"Buzz\"]"
        );
        assert_eq!((by_name("max_of").expected)("[]"), "None");
        assert_eq!((by_name("max_of").expected)("[-3, -1, -2]"), "-1");
        assert_eq!((by_name("distance").expected)("-4, 3"), "7");
    }

    #[test]
    fn max_bugs_out_of_range_is_an_error_naming_the_field() {
        let spec = CodeRepairSpec {
            seed: 0,
            max_bugs: 3,
            templates: Vec::new(),
        };
        let error = code_repair_tasks(&spec, 1).unwrap_err();
        assert!(error.to_string().starts_with("max_bugs:"), "{error}");
    }
}
