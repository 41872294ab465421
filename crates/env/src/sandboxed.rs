//! [`SandboxedTool`]: the `python` and `bash` tools, which run the model's code in
//! `stoke_sandbox` with the episode's [`Workspace`] as the work dir's files.
//!
//! A call: write the workspace files into the run's fresh work dir, run the code (Python takes
//! `{"code": ...}`, Bash `{"command": ...}`), read back the regular files the program left, make
//! them the workspace (a file the program deleted disappears), and answer with stdout, stderr and
//! a note on how the run ended when it did not end well (exit status, timeout, CPU limit, output
//! cap, a signal such as the memory limit's SIGKILL). `touched` lists the workspace paths the
//! call created, changed or deleted, for reward-hacking monitors.
//!
//! What it is not: the jail (every limit and layer is the sandbox's, set once in its
//! `SandboxConfig`), or a persistent interpreter: each call is a new process, and only files
//! carry state from one call to the next (variables do not).
//!
//! Invariants: the workspace is replaced only by a complete read-back; when the read-back is
//! incomplete (over its bounds, or unreadable) or the run never started, the workspace stays as
//! it was and the output says so. A call that did not succeed is `failed`. Entries that are not
//! regular files (a symlink the program made, a FIFO) do not enter the workspace; the output
//! names them. The program's own source file (`main.py`, `main.sh`) is the sandbox's and never
//! a workspace file; a workspace path equal to it makes the call fail with the sandbox's message.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use stoke_sandbox::{
    ExecResult, ExitStatusKind, FileCollection, Language, Program, Sandbox, SandboxConfig,
};

use crate::error::EnvError;
use crate::tool::{Tool, ToolOutput, ToolSpec, Workspace};

/// A tool that runs code of one language in the sandbox, over the episode's workspace.
#[derive(Clone, Debug)]
pub struct SandboxedTool {
    sandbox: Arc<Sandbox>,
    language: Language,
    name: String,
    collection: FileCollection,
}

impl SandboxedTool {
    /// A tool named `name` running `language` (Python or Bash). Fails on another language,
    /// naming the key.
    pub fn new(
        sandbox: Arc<Sandbox>,
        language: Language,
        name: impl Into<String>,
    ) -> Result<SandboxedTool, EnvError> {
        if !matches!(language, Language::Python | Language::Bash) {
            return Err(EnvError::config(
                "language",
                format!(
                    "sandboxed tools run python or bash, not {}",
                    language.name()
                ),
            ));
        }
        Ok(SandboxedTool {
            sandbox,
            language,
            name: name.into(),
            collection: FileCollection::default(),
        })
    }

    /// The `python` tool.
    pub fn python(sandbox: Arc<Sandbox>) -> SandboxedTool {
        SandboxedTool {
            sandbox,
            language: Language::Python,
            name: "python".into(),
            collection: FileCollection::default(),
        }
    }

    /// The `bash` tool.
    pub fn bash(sandbox: Arc<Sandbox>) -> SandboxedTool {
        SandboxedTool {
            sandbox,
            language: Language::Bash,
            name: "bash".into(),
            collection: FileCollection::default(),
        }
    }

    /// The same tool with other bounds on the files read back after each call (the workspace's
    /// size bound: a call that leaves more fails and leaves the workspace as it was).
    pub fn with_collection(mut self, collection: FileCollection) -> SandboxedTool {
        self.collection = collection;
        self
    }

    /// The argument holding the code: `code` for Python, `command` for Bash.
    pub fn argument(&self) -> &'static str {
        match self.language {
            Language::Bash => "command",
            _ => "code",
        }
    }
}

impl Tool for SandboxedTool {
    fn spec(&self) -> ToolSpec {
        let config = self.sandbox.config();
        let (description, example) = match self.language {
            Language::Bash => ("Run a bash command", "ls -la && cat notes.txt"),
            _ => ("Run a Python 3 program", "print(sum(range(10)))"),
        };
        ToolSpec {
            name: self.name.clone(),
            description: format!(
                "{description} in a fresh sandbox (no network, {} s time limit). Files in the \
                 working directory persist between calls; variables do not. Returns stdout and \
                 stderr.",
                config.wall_timeout.as_secs_f64()
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    self.argument(): {"type": "string", "description": format!("e.g. {example:?}")}
                },
                "required": [self.argument()]
            }),
        }
    }

    fn call(&self, arguments: &Value, workspace: &mut Workspace) -> ToolOutput {
        let key = self.argument();
        let Some(source) = arguments.get(key).and_then(Value::as_str) else {
            return ToolOutput::error(format!("error: missing string argument `{key}`"));
        };
        let program = Program {
            language: self.language,
            source: source.to_string(),
            files: workspace
                .files
                .iter()
                .map(|(path, contents)| (path.clone(), contents.clone()))
                .collect(),
            ..Program::default()
        }
        .collecting_files(self.collection);
        let result = self.sandbox.run_blocking(program);
        let mut content = run_report(&result, self.sandbox.config());
        let mut failed = !result.status.success();
        let mut touched = Vec::new();
        match &result.files {
            Some(collected) if collected.incomplete.is_none() => {
                touched = changed_paths(&workspace.files, &collected.files);
                workspace.files = collected.files.clone();
                if !collected.skipped.is_empty() {
                    let names: Vec<String> = collected
                        .skipped
                        .iter()
                        .map(|entry| format!("{} ({})", entry.path, entry.kind))
                        .collect();
                    content.push_str(&format!(
                        "\n[not kept between calls, only regular files are: {}]",
                        names.join(", ")
                    ));
                }
            }
            Some(collected) => {
                failed = true;
                if let Some(reason) = &collected.incomplete {
                    content.push_str(&format!(
                        "\n[the files were not kept: {reason}; the working directory is as it \
                         was before this call]"
                    ));
                }
            }
            // The run never started (a sandbox error, reported above): nothing changed.
            None => {}
        }
        ToolOutput {
            content,
            failed,
            touched,
        }
    }
}

/// Paths created, changed or deleted between `before` and `after`, sorted.
pub fn changed_paths(
    before: &BTreeMap<String, Vec<u8>>,
    after: &BTreeMap<String, Vec<u8>>,
) -> Vec<String> {
    let mut paths: Vec<String> = after
        .iter()
        .filter(|(path, contents)| before.get(*path) != Some(*contents))
        .map(|(path, _)| path.clone())
        .chain(
            before
                .keys()
                .filter(|path| !after.contains_key(*path))
                .cloned(),
        )
        .collect();
    paths.sort();
    paths
}

/// stdout, stderr and a note on how the run ended, as the model reads it.
pub fn run_report(result: &ExecResult, config: &SandboxConfig) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !result.stdout.is_empty() {
        parts.push(result.stdout_text());
    }
    if result.stdout_truncated {
        parts.push("[stdout cut here]".into());
    }
    if !result.stderr.is_empty() {
        parts.push(result.stderr_text());
    }
    if result.stderr_truncated {
        parts.push("[stderr cut here]".into());
    }
    let note = match &result.status {
        ExitStatusKind::Exited(0) => None,
        ExitStatusKind::Exited(code) => Some(format!("[exit status {code}]")),
        ExitStatusKind::Signaled(signal) => Some(match *signal {
            libc_signal::SIGKILL => format!(
                "[killed by SIGKILL; the usual cause is the memory limit ({} MiB)]",
                config.memory_bytes >> 20
            ),
            libc_signal::SIGSEGV => "[killed by SIGSEGV (segmentation fault)]".into(),
            libc_signal::SIGXFSZ => format!(
                "[killed by SIGXFSZ: a file went over the {} MiB file size limit]",
                config.max_file_bytes >> 20
            ),
            other => format!("[killed by signal {other}]"),
        }),
        ExitStatusKind::TimedOut => Some(format!(
            "[timed out after {} s: every process was stopped]",
            config.wall_timeout.as_secs_f64()
        )),
        ExitStatusKind::CpuLimit => Some(format!(
            "[stopped at the CPU time limit of {} s]",
            config.cpu_seconds
        )),
        ExitStatusKind::OutputLimit => Some(format!(
            "[stopped: the output went over {} bytes; the rest was cut]",
            config.max_output_bytes
        )),
        ExitStatusKind::SandboxError(message) => Some(format!("[sandbox error: {message}]")),
    };
    parts.extend(note);
    if parts.is_empty() {
        return "[no output]".into();
    }
    let mut text = String::new();
    for part in parts {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&part);
    }
    text
}

/// Linux signal numbers used in the notes (the env crate does not depend on `libc`).
mod libc_signal {
    pub const SIGKILL: i32 = 9;
    pub const SIGSEGV: i32 = 11;
    pub const SIGXFSZ: i32 = 25;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(entries: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        entries
            .iter()
            .map(|(path, text)| (path.to_string(), text.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn changed_paths_lists_created_changed_and_deleted() {
        let before = files(&[("same", "1"), ("edited", "a"), ("gone", "x")]);
        let after = files(&[("same", "1"), ("edited", "b"), ("new", "y")]);
        assert_eq!(changed_paths(&before, &after), ["edited", "gone", "new"]);
        assert!(changed_paths(&before, &before).is_empty());
    }
}
