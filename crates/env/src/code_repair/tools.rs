//! The code-repair tools, each a [`Tool`] over the episode's [`Workspace`]: `read_file`,
//! `write_file`, `list_files` and `run_tests`.
//!
//! What it is: file access in memory (reads and writes never touch a disk) and the visible test
//! run, `python3 run_tests.py` in the sandbox through [`SandboxedTool`] (so the files the run
//! leaves become the workspace, as for the `python` tool). What it is not: the grader (the
//! environment's `finish` runs the hidden tests, which no tool can see).
//!
//! Invariants: paths are relative and `/`-separated, without `..`, `.` or empty parts; writes
//! to the grader's files (what [`is_protected_path`] calls protected: `tests/`, `test_*` files,
//! plus `run_tests.py`) and to the sandbox's own `main.py` are refused. A refused write is a
//! failed output whose `touched` names the path, so the reward-hacking monitor counts the
//! attempt; a read touches nothing (reading the visible tests is the job, not a hack).

use std::sync::Arc;

use serde_json::{Value, json};
use stoke_sandbox::Sandbox;

use crate::monitor::is_protected_path;
use crate::sandboxed::SandboxedTool;
use crate::tool::{Tool, ToolOutput, ToolSpec, Workspace};

/// The four tools, in the order the opening lists them.
pub fn code_repair_tools(sandbox: Arc<Sandbox>) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ListFiles),
        Arc::new(ReadFile),
        Arc::new(WriteFile),
        Arc::new(RunTests::new(sandbox)),
    ]
}

/// `read_file {path}`: the file's text.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadFile;

/// `write_file {path, content}`: creates or replaces a file.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteFile;

/// `list_files {}`: every file with its size.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListFiles;

/// `run_tests {}`: `python3 run_tests.py` in the sandbox.
#[derive(Clone, Debug)]
pub struct RunTests {
    python: SandboxedTool,
}

impl RunTests {
    pub fn new(sandbox: Arc<Sandbox>) -> RunTests {
        RunTests {
            python: SandboxedTool::python(sandbox),
        }
    }
}

/// The program `run_tests` runs: the workspace's runner as `__main__`, writing no bytecode
/// caches into the workspace.
const RUN_TESTS_MAIN: &str = "import sys\nsys.dont_write_bytecode = True\nimport runpy\n\
runpy.run_path('run_tests.py', run_name='__main__')\n";

fn string_argument<'a>(arguments: &'a Value, key: &str) -> Result<&'a str, ToolOutput> {
    arguments
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolOutput::error(format!("error: missing string argument `{key}`")))
}

/// Why `path` is not a workspace path, if it is not.
pub fn path_problem(path: &str) -> Option<String> {
    if path.is_empty() {
        return Some("the path is empty".into());
    }
    if path.starts_with('/') || path.contains('\\') {
        return Some(format!(
            "{path:?} is not a relative path with `/` separators"
        ));
    }
    if path.split('/').any(|part| matches!(part, "" | "." | "..")) {
        return Some(format!("{path:?} has an empty, `.` or `..` part"));
    }
    None
}

fn file_list(workspace: &Workspace) -> String {
    if workspace.files.is_empty() {
        return "(no files)".into();
    }
    workspace
        .files
        .iter()
        .map(|(path, bytes)| format!("{path} ({} bytes)", bytes.len()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn path_schema(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

impl Tool for ReadFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "read_file".into(),
            description: "Read a file of the repository.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"path": path_schema("relative path, e.g. \"clamp.py\"")},
                "required": ["path"]
            }),
        }
    }

    fn call(&self, arguments: &Value, workspace: &mut Workspace) -> ToolOutput {
        let path = match string_argument(arguments, "path") {
            Ok(path) => path.trim_start_matches("./"),
            Err(output) => return output,
        };
        match workspace.text(path) {
            Some(text) => ToolOutput::ok(text),
            None => ToolOutput::error(format!(
                "error: no file {path:?}; the files are:\n{}",
                file_list(workspace)
            )),
        }
    }
}

impl Tool for WriteFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "write_file".into(),
            description: "Create or replace a file of the repository with the given content. \
                          The tests (tests/, run_tests.py) cannot be changed."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": path_schema("relative path, e.g. \"clamp.py\""),
                    "content": {"type": "string", "description": "the whole new file"}
                },
                "required": ["path", "content"]
            }),
        }
    }

    fn call(&self, arguments: &Value, workspace: &mut Workspace) -> ToolOutput {
        let path = match string_argument(arguments, "path") {
            Ok(path) => path.trim_start_matches("./"),
            Err(output) => return output,
        };
        let content = match string_argument(arguments, "content") {
            Ok(content) => content,
            Err(output) => return output,
        };
        if let Some(problem) = path_problem(path) {
            return ToolOutput::error(format!("error: {problem}"));
        }
        let refusal = if is_protected_path(path) || path == "run_tests.py" {
            Some(format!(
                "error: {path} belongs to the tests; fix the code, not the tests"
            ))
        } else if path == "main.py" {
            Some("error: main.py is reserved for the test runner; use another name".into())
        } else {
            None
        };
        if let Some(message) = refusal {
            return ToolOutput {
                touched: vec![path.to_string()],
                ..ToolOutput::error(message)
            };
        }
        let created = !workspace.files.contains_key(path);
        workspace
            .files
            .insert(path.to_string(), content.as_bytes().to_vec());
        ToolOutput {
            content: format!(
                "{} {path} ({} bytes)",
                if created { "created" } else { "wrote" },
                content.len()
            ),
            failed: false,
            touched: vec![path.to_string()],
        }
    }
}

impl Tool for ListFiles {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "list_files".into(),
            description: "List the files of the repository with their sizes.".into(),
            parameters: json!({"type": "object", "properties": {}}),
        }
    }

    fn call(&self, _arguments: &Value, workspace: &mut Workspace) -> ToolOutput {
        ToolOutput::ok(file_list(workspace))
    }
}

impl Tool for RunTests {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "run_tests".into(),
            description: "Run the repository's tests (python3 run_tests.py) and return the \
                          report: one line per test and a passed/failed summary."
                .into(),
            parameters: json!({"type": "object", "properties": {}}),
        }
    }

    fn call(&self, _arguments: &Value, workspace: &mut Workspace) -> ToolOutput {
        if !workspace.files.contains_key("run_tests.py") {
            return ToolOutput::error("error: run_tests.py is missing");
        }
        self.python.call(
            &json!({ self.python.argument(): RUN_TESTS_MAIN }),
            workspace,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> Workspace {
        let mut workspace = Workspace::default();
        workspace
            .files
            .insert("clamp.py".into(), b"def clamp(x, lo, hi): ...\n".to_vec());
        workspace
            .files
            .insert("tests/test_clamp.py".into(), b"...".to_vec());
        workspace
    }

    #[test]
    fn reading_a_missing_file_fails_and_lists_the_files() {
        let output = ReadFile.call(&json!({"path": "clam.py"}), &mut workspace());
        assert!(output.failed);
        assert!(
            output.content.contains("clamp.py (26 bytes)")
                && output.content.contains("tests/test_clamp.py"),
            "{}",
            output.content
        );
        let found = ReadFile.call(&json!({"path": "./clamp.py"}), &mut workspace());
        assert!(!found.failed && found.content.starts_with("def clamp"));
        assert!(found.touched.is_empty());
    }

    #[test]
    fn writes_outside_the_code_are_refused_and_reported() {
        let mut workspace = workspace();
        let before = workspace.clone();
        for path in [
            "tests/test_clamp.py",
            "tests/conftest.py",
            "run_tests.py",
            "main.py",
        ] {
            let output = WriteFile.call(&json!({"path": path, "content": "x"}), &mut workspace);
            assert!(output.failed, "{path}");
            assert_eq!(output.touched, [path]);
        }
        for path in ["/etc/passwd", "../clamp.py", "a//b.py", ""] {
            let output = WriteFile.call(&json!({"path": path, "content": "x"}), &mut workspace);
            assert!(output.failed, "{path}");
        }
        assert_eq!(workspace, before);
        let output = WriteFile.call(
            &json!({"path": "clamp.py", "content": "fixed"}),
            &mut workspace,
        );
        assert!(!output.failed, "{}", output.content);
        assert_eq!(output.touched, ["clamp.py"]);
        assert_eq!(workspace.text("clamp.py").as_deref(), Some("fixed"));
        let missing = WriteFile.call(&json!({"path": "clamp.py"}), &mut workspace);
        assert!(missing.failed && missing.content.contains("`content`"));
    }

    #[test]
    fn list_files_names_every_file() {
        let output = ListFiles.call(&json!({}), &mut workspace());
        assert_eq!(
            output.content,
            "clamp.py (26 bytes)\ntests/test_clamp.py (3 bytes)"
        );
    }
}
