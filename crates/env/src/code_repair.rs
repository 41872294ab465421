//! Code repair, SWE-style at toy size: a small Python repository with failing tests in the
//! sandbox; the model reads files, edits them and runs the tests with tools; the outcome reward
//! comes from hidden tests run on the final files.
//!
//! What it is: [`CodeRepair`], an [`Environment`] that wraps a [`ToolEnvironment`] with the
//! [`tools`] (`list_files`, `read_file`, `write_file`, `run_tests`): the opening is its system
//! prompt (the tools described in it when asked) and the task's prompt; `start` loads the task's
//! repository into the episode's workspace; turns run tool calls, and a turn without tool calls
//! is the final answer; `finish` scores the final state. The [`tasks`] generator draws the
//! repositories (`code_repair_tasks`).
//!
//! How the final state is scored: the hidden tests (`check(candidate)` over the module's
//! function, from the task's data, never in the workspace) run against the final module file by
//! `stoke_reward`'s unit-test judge with fraction scoring (the two-process judge: the model's
//! code never shares an interpreter with the assertions, so patched builtins or forged reports
//! reach nothing). That gives the fraction of assertion sites passed; a buggy module already
//! passes some, so the outcome reward is the share of the remaining gap the final module closed
//! ([`gap_closed`]): 1 when every hidden test passes, 0 for an untouched, missing or worse
//! module (doing nothing earns nothing), in between for a partial fix. A crash or a timeout of
//! the final module passes nothing. Only the module file is graded: helpers the model creates
//! in other files are not importable from it.
//!
//! Invariants: the hidden tests and the solution stay in the task's data and never enter the
//! workspace or a message; every tool call goes through [`ToolEnvironment`]'s episode (limits,
//! timeouts, records), so a call here is recorded exactly as in any tool environment; `finish`
//! runs at most two judge runs (the final module, then the generated one when the fix is
//! partial).
//!
//! What it is not: the task loader or the pipeline's wiring (`[environment] kind` and `[tasks]
//! kind` are read elsewhere), or the run's configured reward (the final answer's text is not
//! scored here; the files are).

pub mod tasks;
pub mod tools;

use std::sync::Arc;

use serde_json::Value;
use stoke_reward::unit_tests::{TestScoring, UnitTestsConfig, UnitTestsVerifier};
use stoke_reward::verifier::{Outcome, Reference, RewardInput, Verifier};
use stoke_sandbox::{Sandbox, SandboxConfigFile};

use crate::environment::{EnvStep, EnvTask, Environment, Episode, ModelTurn, Opening, StopReason};
use crate::error::EnvError;
use crate::tool::{ToolSpec, Workspace};
use crate::tool_env::{ToolEnvironment, ToolEpisode, ToolLimits};
use crate::toolbox::tools_system_prompt;

pub use tasks::{CodeRepairSpec, RUN_TESTS_PY, code_repair_tasks};
pub use tools::{ListFiles, ReadFile, RunTests, WriteFile, code_repair_tools};

/// The system prompt of the environment (before the tool list, when the tools are described).
pub const CODE_REPAIR_SYSTEM_PROMPT: &str = "You are fixing a bug in a small Python \
repository. Use the tools to list and read its files, edit the code with write_file (each write \
replaces the whole file) and run the tests with run_tests. Do not change the tests: the fix is \
checked against further tests you cannot see. When the tests pass, reply without a tool call \
to finish.";

/// The turns of a scripted expert on `task`, as Hermes-format model texts: read the module,
/// write it back fixed (the task's `solution`), run the tests, then finish without a tool call
/// naming what was fixed. Played through the environment (`stoke env --demonstrations`), they
/// give SFT conversations whose tool messages are the tools' real outputs, for a warm start on
/// tool use before GRPO. Errors name the missing task field.
pub fn expert_turns(task: &EnvTask) -> Result<Vec<String>, EnvError> {
    let hidden = HiddenTests::of(task)?;
    let solution = task
        .data
        .get("solution")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            EnvError::config(
                "solution",
                format!("task {}: missing string field", task.id),
            )
        })?;
    let bugs: Vec<&str> = task
        .data
        .get("bugs")
        .and_then(Value::as_array)
        .map(|bugs| bugs.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // Name first, as the tool prompt's example writes it (`json!` would sort the keys).
    let call = |name: &str, arguments: Value| {
        format!("<tool_call>{{\"name\": \"{name}\", \"arguments\": {arguments}}}</tool_call>")
    };
    let what = if bugs.is_empty() {
        "the bug".to_string()
    } else {
        format!("the {}", bugs.join(" and the "))
    };
    Ok(vec![
        call("read_file", serde_json::json!({"path": hidden.module})),
        call(
            "write_file",
            serde_json::json!({"path": hidden.module, "content": solution}),
        ),
        call("run_tests", serde_json::json!({})),
        format!("I fixed {what} in {}; the tests pass now.", hidden.module),
    ])
}

/// The code-repair environment. Shared by every episode of a run.
pub struct CodeRepair {
    tools: ToolEnvironment,
    judge: Arc<UnitTestsVerifier>,
}

impl std::fmt::Debug for CodeRepair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeRepair")
            .field("tools", &self.tools)
            .finish()
    }
}

impl CodeRepair {
    /// The environment running tests and hidden tests in `sandbox`; `describe_tools` puts the
    /// tools and their call format in the system prompt (for templates that cannot render a
    /// `tools` list).
    pub fn new(
        sandbox: Arc<Sandbox>,
        describe_tools: bool,
        limits: ToolLimits,
    ) -> Result<CodeRepair, EnvError> {
        let tools = tools::code_repair_tools(Arc::clone(&sandbox));
        let system_prompt = if describe_tools {
            let specs: Vec<ToolSpec> = tools.iter().map(|tool| tool.spec()).collect();
            format!(
                "{CODE_REPAIR_SYSTEM_PROMPT}\n\n{}",
                tools_system_prompt(&specs)
            )
        } else {
            CODE_REPAIR_SYSTEM_PROMPT.to_string()
        };
        let judge = UnitTestsVerifier::new(
            &UnitTestsConfig {
                scoring: TestScoring::Fraction,
                builtin_results_only: true,
                extract_fenced_code: false,
            },
            Sandbox::clone(&sandbox),
        )
        .map_err(|e| EnvError::config("environment", format!("the hidden-test judge: {e}")))?;
        Ok(CodeRepair {
            tools: ToolEnvironment::new("code_repair", Some(system_prompt), tools, limits)?
                .requiring_tool(),
            judge: Arc::new(judge),
        })
    }

    /// [`CodeRepair::new`] on a sandbox with the default settings (`SandboxConfigFile`'s, what
    /// the `python` and `bash` tools of a toolbox run in).
    pub fn with_default_sandbox(
        describe_tools: bool,
        limits: ToolLimits,
    ) -> Result<CodeRepair, EnvError> {
        let config = SandboxConfigFile::default()
            .into_config()
            .map_err(|e| EnvError::config("environment", format!("sandbox: {e}")))?;
        let sandbox = Sandbox::new(config).map_err(|e| {
            EnvError::config(
                "environment",
                format!("starting the sandbox for the tests: {e}"),
            )
        })?;
        CodeRepair::new(Arc::new(sandbox), describe_tools, limits)
    }

    /// The fraction of `task`'s hidden tests (assertion sites) that `workspace`'s module
    /// passes; 0 when the module file is gone.
    pub fn hidden_fraction(&self, task: &EnvTask, workspace: &Workspace) -> Result<f64, EnvError> {
        let hidden = HiddenTests::of(task)?;
        match workspace.text(&hidden.module) {
            Some(module) => hidden_fraction(&self.judge, &hidden, &module),
            None => Ok(0.0),
        }
    }
}

fn hidden_fraction(
    judge: &UnitTestsVerifier,
    hidden: &HiddenTests,
    module: &str,
) -> Result<f64, EnvError> {
    let reference = Reference {
        tests: Some(hidden.tests.clone()),
        entry_point: Some(hidden.entry_point.clone()),
        ..Reference::default()
    };
    let outcome = judge.score(&RewardInput::new("", module, &reference));
    if outcome.outcome == Outcome::UnparseableGold {
        return Err(EnvError::failed(
            "code_repair",
            format!(
                "the hidden tests could not run: {}",
                outcome.details.reason.unwrap_or_default()
            ),
        ));
    }
    Ok(outcome.score.clamp(0.0, 1.0))
}

/// The outcome reward: the share of the gap between the generated module's hidden fraction
/// (`before`) and 1 that the final module closed, in `0..=1`.
pub fn gap_closed(before: f64, after: f64) -> f64 {
    if after >= 1.0 {
        1.0
    } else if before >= 1.0 {
        after
    } else {
        ((after - before) / (1.0 - before)).clamp(0.0, 1.0)
    }
}

/// What `finish` grades: the module file, its function and the hidden `check(candidate)`.
#[derive(Clone, Debug, PartialEq)]
pub struct HiddenTests {
    pub module: String,
    pub entry_point: String,
    pub tests: String,
}

impl HiddenTests {
    /// Read from the task's data (`module`, `entry_point`, `hidden_tests`); errors name the key.
    pub fn of(task: &EnvTask) -> Result<HiddenTests, EnvError> {
        let field = |key: &str| {
            task.data
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| {
                    EnvError::config(key, format!("task {}: missing string field", task.id))
                })
        };
        Ok(HiddenTests {
            module: field("module")?,
            entry_point: field("entry_point")?,
            tests: field("hidden_tests")?,
        })
    }
}

/// The repository of `task` (its data's `files`, path -> text) as a workspace.
pub fn repository(task: &EnvTask) -> Result<Workspace, EnvError> {
    let files = task
        .data
        .get("files")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            EnvError::config("files", format!("task {}: missing object field", task.id))
        })?;
    let mut workspace = Workspace::default();
    for (path, text) in files {
        let text = text.as_str().ok_or_else(|| {
            EnvError::config("files", format!("task {}: {path:?} is not text", task.id))
        })?;
        if let Some(problem) = tools::path_problem(path) {
            return Err(EnvError::config(
                "files",
                format!("task {}: {problem}", task.id),
            ));
        }
        workspace
            .files
            .insert(path.clone(), text.as_bytes().to_vec());
    }
    Ok(workspace)
}

impl Environment for CodeRepair {
    fn name(&self) -> &str {
        "code_repair"
    }

    fn opening(&self, task: &EnvTask) -> Result<Opening, EnvError> {
        self.tools.opening(task)
    }

    fn start(&self, task: &EnvTask) -> Result<Box<dyn Episode>, EnvError> {
        let repository = repository(task)?;
        let hidden = HiddenTests::of(task)?;
        let generated_module = repository.text(&hidden.module).ok_or_else(|| {
            EnvError::config(
                "module",
                format!("task {}: {} is not in its files", task.id, hidden.module),
            )
        })?;
        Ok(Box::new(CodeRepairEpisode {
            tools: self.tools.episode(repository),
            judge: Arc::clone(&self.judge),
            hidden,
            generated_module,
        }))
    }

    fn requires_tool(&self) -> bool {
        true
    }

    fn grades_outcome(&self) -> bool {
        true
    }
}

/// One episode: the tool episode over the repository, and what its final files are graded on.
struct CodeRepairEpisode {
    tools: ToolEpisode,
    judge: Arc<UnitTestsVerifier>,
    hidden: HiddenTests,
    /// The module as the task generated it: the baseline of the reward.
    generated_module: String,
}

impl Episode for CodeRepairEpisode {
    fn step(&mut self, turn: &ModelTurn<'_>) -> Result<EnvStep, EnvError> {
        self.tools.step(turn)
    }

    fn finish(&mut self, _stop: &StopReason) -> Result<f64, EnvError> {
        let Some(module) = self.tools.workspace().text(&self.hidden.module) else {
            return Ok(0.0);
        };
        if module == self.generated_module {
            return Ok(0.0);
        }
        let after = hidden_fraction(&self.judge, &self.hidden, &module)?;
        if after >= 1.0 {
            return Ok(1.0);
        }
        let before = hidden_fraction(&self.judge, &self.hidden, &self.generated_module)?;
        Ok(gap_closed(before, after))
    }
}
