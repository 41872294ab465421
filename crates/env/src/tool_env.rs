//! [`ToolEnvironment`]: an environment made of a task, a set of tools and a final answer, the
//! shape of verifiers' `ToolEnv` and verl's tool agent loop.
//!
//! An episode: the opening is an optional system prompt and the task's prompt as the user
//! message, with the tools offered. Each model turn with tool calls gets one `tool` message per
//! call (`tool_call_id` and `name` set, as OpenAI and the chat templates expect), in call order;
//! a turn without tool calls is the final answer and ends the episode. The final answer is
//! scored by the run's configured reward (the pipeline hands it the last turn's text), so this
//! environment gives no reward of its own.
//!
//! Failures the model can learn from are tool messages, not episode failures: an unknown tool, a
//! call whose arguments are not a JSON object, a tool error, a tool that timed out (each marked
//! `failed` in the record). Output longer than `max_output_bytes` is cut in the middle with a
//! note saying how much was cut (verl's `tool_response_truncate_side = middle`).
//!
//! What it is not: the tool-call parser (the runner parses the model's text with the run's
//! parser and passes the calls in) or a sandbox (sandboxed tools bring their own).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use stoke_tokenizer::chat::{ChatMessage, Role, TemplateValue};
use stoke_tokenizer::tool_calls::ToolCall;

use crate::environment::{
    EnvStep, EnvTask, Environment, Episode, ModelTurn, Opening, ToolCallRecord,
};
use crate::error::EnvError;
use crate::guard::guarded;
use crate::tool::{Tool, ToolOutput, Workspace};

/// Limits on tool use within one episode.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolLimits {
    /// Calls run per model turn; later calls get an error message instead.
    pub max_calls_per_turn: usize,
    /// Bytes of one tool message's content (cut in the middle beyond it).
    pub max_output_bytes: usize,
    /// Wall time of one call.
    pub timeout: Duration,
}

impl Default for ToolLimits {
    fn default() -> Self {
        ToolLimits {
            max_calls_per_turn: 4,
            max_output_bytes: 2_048,
            // Above the sandbox's default wall time (10 s), so a sandboxed tool reports its own
            // timeout (with what the program printed) before this last line fires.
            timeout: Duration::from_secs(30),
        }
    }
}

/// A task, tools and a final answer.
#[derive(Clone)]
pub struct ToolEnvironment {
    name: String,
    system_prompt: Option<String>,
    tools: Vec<Arc<dyn Tool>>,
    limits: ToolLimits,
    requires_tool: bool,
}

impl std::fmt::Debug for ToolEnvironment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolEnvironment")
            .field("name", &self.name)
            .field(
                "tools",
                &self.tools.iter().map(|t| t.spec().name).collect::<Vec<_>>(),
            )
            .field("limits", &self.limits)
            .finish()
    }
}

impl ToolEnvironment {
    /// Fails on two tools with one name (the model could not tell them apart).
    pub fn new(
        name: impl Into<String>,
        system_prompt: Option<String>,
        tools: Vec<Arc<dyn Tool>>,
        limits: ToolLimits,
    ) -> Result<ToolEnvironment, EnvError> {
        let mut names: Vec<String> = tools.iter().map(|tool| tool.spec().name).collect();
        names.sort();
        if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(EnvError::config(
                "tools",
                format!("two tools are named {:?}", pair[0]),
            ));
        }
        if limits.max_calls_per_turn == 0 {
            return Err(EnvError::config(
                "max_tool_calls_per_turn",
                "must be at least 1",
            ));
        }
        Ok(ToolEnvironment {
            name: name.into(),
            system_prompt,
            tools,
            limits,
            requires_tool: false,
        })
    }

    /// The same environment, declaring that its tasks need a tool call.
    pub fn requiring_tool(mut self) -> ToolEnvironment {
        self.requires_tool = true;
        self
    }

    pub fn tools(&self) -> &[Arc<dyn Tool>] {
        &self.tools
    }

    /// An episode whose workspace starts as `workspace` (an environment that wraps this one
    /// loads its task's files this way, and reads the final files back with
    /// [`ToolEpisode::workspace`]).
    pub fn episode(&self, workspace: Workspace) -> ToolEpisode {
        ToolEpisode {
            env: self.clone(),
            workspace,
        }
    }
}

impl Environment for ToolEnvironment {
    fn name(&self) -> &str {
        &self.name
    }

    fn opening(&self, task: &EnvTask) -> Result<Opening, EnvError> {
        let mut messages = Vec::new();
        if let Some(system) = &self.system_prompt {
            messages.push(ChatMessage::system(system.clone()));
        }
        messages.push(ChatMessage::user(task.prompt.clone()));
        Ok(Opening {
            messages,
            tools: self.tools.iter().map(|tool| tool.spec()).collect(),
        })
    }

    fn requires_tool(&self) -> bool {
        self.requires_tool
    }

    fn start(&self, _task: &EnvTask) -> Result<Box<dyn Episode>, EnvError> {
        Ok(Box::new(self.episode(Workspace::default())))
    }
}

/// One episode of a [`ToolEnvironment`]: its tools' calls over its workspace.
pub struct ToolEpisode {
    env: ToolEnvironment,
    workspace: Workspace,
}

impl Episode for ToolEpisode {
    fn step(&mut self, turn: &ModelTurn<'_>) -> Result<EnvStep, EnvError> {
        if turn.tool_calls.is_empty() {
            return Ok(EnvStep {
                done: true,
                ..EnvStep::default()
            });
        }
        let mut step = EnvStep::default();
        for (index, call) in turn.tool_calls.iter().enumerate() {
            let started = Instant::now();
            let output = if index >= self.env.limits.max_calls_per_turn {
                ToolOutput::error(format!(
                    "error: at most {} tool calls per turn",
                    self.env.limits.max_calls_per_turn
                ))
            } else {
                self.run(call)
            };
            step.tool_calls.push(ToolCallRecord {
                turn: turn.index,
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                failed: output.failed,
                seconds: started.elapsed().as_secs_f64(),
                touched: output.touched.clone(),
            });
            step.messages.push(tool_message(
                call,
                cut_middle(&output.content, self.env.limits.max_output_bytes),
            ));
        }
        Ok(step)
    }
}

impl ToolEpisode {
    /// The episode's files as the tool calls so far left them.
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    fn run(&mut self, call: &ToolCall) -> ToolOutput {
        let Some(tool) = self
            .env
            .tools
            .iter()
            .find(|tool| tool.spec().name == call.name)
        else {
            let known: Vec<String> = self.env.tools.iter().map(|t| t.spec().name).collect();
            return ToolOutput::error(format!(
                "error: unknown tool {:?}; the tools are {}",
                call.name,
                known.join(", ")
            ));
        };
        let arguments: Value = match serde_json::from_str(&call.arguments) {
            Ok(value @ Value::Object(_)) => value,
            Ok(_) | Err(_) => {
                return ToolOutput::error(format!(
                    "error: the arguments of {} must be a JSON object, got {}",
                    call.name,
                    cut_middle(&call.arguments, 200)
                ));
            }
        };
        let tool = Arc::clone(tool);
        let mut workspace = self.workspace.clone();
        let result = guarded(&call.name, self.env.limits.timeout, move || {
            let output = tool.call(&arguments, &mut workspace);
            Ok((output, workspace))
        });
        match result {
            Ok((output, workspace)) => {
                self.workspace = workspace;
                output
            }
            Err(EnvError::TimedOut { seconds, .. }) => {
                ToolOutput::error(format!("error: {} timed out after {seconds} s", call.name))
            }
            Err(error) => ToolOutput::error(format!("error: {error}")),
        }
    }
}

/// The `tool` message answering `call`.
pub fn tool_message(call: &ToolCall, content: String) -> ChatMessage {
    let mut message = ChatMessage::new(Role::Tool, content);
    message
        .extra
        .insert("tool_call_id".into(), TemplateValue::from(call.id.clone()));
    message
        .extra
        .insert("name".into(), TemplateValue::from(call.name.clone()));
    message
}

/// `text` cut to at most about `max_bytes`, keeping its head and tail (char boundaries kept).
pub fn cut_middle(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let half = max_bytes / 2;
    let mut head = half;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - half;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[... {} bytes cut ...]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calculator::Calculator;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: format!("call-{name}"),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn env() -> ToolEnvironment {
        ToolEnvironment::new(
            "calc",
            Some("Use the calculator.".into()),
            vec![Arc::new(Calculator)],
            ToolLimits::default(),
        )
        .unwrap()
    }

    fn turn<'a>(calls: &'a [ToolCall]) -> ModelTurn<'a> {
        ModelTurn {
            index: 0,
            text: "",
            content: None,
            tool_calls: calls,
        }
    }

    #[test]
    fn a_tool_call_gets_a_tool_message_with_its_id() {
        let env = env();
        let task = EnvTask {
            prompt: "What is 48213 * 9127?".into(),
            ..EnvTask::default()
        };
        let opening = env.opening(&task).unwrap();
        assert_eq!(opening.messages.len(), 2);
        assert_eq!(opening.tools[0].name, "calculator");
        let mut episode = env.start(&task).unwrap();
        let calls = [call("calculator", r#"{"expression": "48213 * 9127"}"#)];
        let step = episode.step(&turn(&calls)).unwrap();
        assert!(!step.done);
        assert_eq!(step.messages.len(), 1);
        assert_eq!(step.messages[0].role, Role::Tool);
        assert_eq!(
            step.messages[0].content.as_ref().unwrap().joined_text(),
            "440040051"
        );
        assert_eq!(
            step.messages[0].extra["tool_call_id"].as_str(),
            Some("call-calculator")
        );
        let done = episode.step(&turn(&[])).unwrap();
        assert!(done.done && done.messages.is_empty());
    }

    #[test]
    fn bad_calls_become_failed_tool_messages_not_errors() {
        let env = env();
        let mut episode = env.start(&EnvTask::default()).unwrap();
        let calls = [
            call("search", "{}"),
            call("calculator", "not json"),
            call("calculator", r#"{"expression": "1/0"}"#),
        ];
        let step = episode.step(&turn(&calls)).unwrap();
        assert_eq!(step.tool_calls.len(), 3);
        assert!(step.tool_calls.iter().all(|record| record.failed));
        let texts: Vec<String> = step
            .messages
            .iter()
            .map(|m| m.content.as_ref().unwrap().joined_text())
            .collect();
        assert!(texts[0].contains("unknown tool \"search\""));
        assert!(texts[1].contains("JSON object"));
        assert!(texts[2].contains("division by zero"));
    }

    #[test]
    fn long_output_is_cut_in_the_middle() {
        let text = "a".repeat(600) + &"b".repeat(600);
        let cut = cut_middle(&text, 100);
        assert!(cut.starts_with(&"a".repeat(50)) && cut.ends_with(&"b".repeat(50)));
        assert!(cut.contains("[... 1100 bytes cut ...]"));
        assert_eq!(cut_middle("short", 100), "short");
    }
}
