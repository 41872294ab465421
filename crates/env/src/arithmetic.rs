//! The calculator task: arithmetic on numbers too large for a small model to work out in its
//! head, and easy with the `calculator` tool. The speedrun's agent stage trains on it.
//!
//! What it is: a seeded generator of [`EnvTask`]s (`"What is 48213 * 9127?"`, gold answer
//! `"440040051"`), the [`calculator_environment`] that offers the tool, and
//! [`tool_use_trace`], the ideal conversation for a task (call the tool, read the result,
//! answer), which SFT on tool-use traces learns from. What it is not: the reward (the run's
//! `exact_match` or `math` reward scores the final answer against the gold one).
//!
//! Tasks are deterministic in (seed, index), so a held-out set is a different seed.

use std::sync::Arc;

use num_bigint::BigInt;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use stoke_reward::Reference;
use stoke_tokenizer::chat::{ChatMessage, Role, TemplateValue};
use stoke_tokenizer::tool_calls::ToolCall;

use crate::calculator::Calculator;
use crate::environment::EnvTask;
use crate::error::EnvError;
use crate::tool::Tool;
use crate::tool_env::{ToolEnvironment, ToolLimits, tool_message};

/// The system prompt of the calculator environment: the tool and the Hermes call format, for
/// templates that do not render tools themselves.
pub const CALCULATOR_SYSTEM_PROMPT: &str = "You can use a calculator. To call it, write \
<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"...\"}}</tool_call> \
and wait for the result. Then give the final answer as a number.";

/// How the tasks are drawn.
#[derive(Clone, Debug, PartialEq)]
pub struct ArithmeticSpec {
    /// Digits of each operand (at least 1).
    pub digits: u32,
    pub seed: u64,
}

impl Default for ArithmeticSpec {
    fn default() -> Self {
        ArithmeticSpec { digits: 5, seed: 0 }
    }
}

/// `count` tasks from `spec`; task `i` depends only on (seed, i).
pub fn arithmetic_tasks(spec: &ArithmeticSpec, count: usize) -> Result<Vec<EnvTask>, EnvError> {
    if !(1..=18).contains(&spec.digits) {
        return Err(EnvError::config(
            "digits",
            format!("must be in 1..=18, got {}", spec.digits),
        ));
    }
    Ok((0..count).map(|index| task(spec, index as u64)).collect())
}

fn task(spec: &ArithmeticSpec, index: u64) -> EnvTask {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let low = 10u64.pow(spec.digits - 1);
    let high = 10u64.pow(spec.digits);
    let a = rng.random_range(low..high);
    let b = rng.random_range(low..high);
    let (expression, value) = match rng.random_range(0..3) {
        0 => (format!("{a} * {b}"), BigInt::from(a) * BigInt::from(b)),
        1 => (format!("{a} + {b}"), BigInt::from(a) + BigInt::from(b)),
        _ => {
            let c = rng.random_range(low..high);
            (
                format!("{a} * {b} - {c}"),
                BigInt::from(a) * BigInt::from(b) - BigInt::from(c),
            )
        }
    };
    EnvTask {
        id: format!("arithmetic-{}-{index}", spec.seed),
        prompt: format!("What is {expression}?"),
        reference: Reference {
            answer: Some(value.to_string()),
            ..Reference::default()
        },
        data: [("expression".to_string(), json!(expression))]
            .into_iter()
            .collect(),
    }
}

/// The calculator environment; `describe_tools` puts the tool and its call format in the system
/// prompt (for templates that cannot render a `tools` list).
pub fn calculator_environment(
    describe_tools: bool,
    limits: ToolLimits,
) -> Result<ToolEnvironment, EnvError> {
    let tools: Vec<Arc<dyn Tool>> = vec![Arc::new(Calculator)];
    Ok(ToolEnvironment::new(
        "calculator",
        describe_tools.then(|| CALCULATOR_SYSTEM_PROMPT.to_string()),
        tools,
        limits,
    )?
    .requiring_tool())
}

/// The ideal conversation after the opening: a Hermes tool call, the tool's result, the answer.
pub fn tool_use_trace(task: &EnvTask) -> Vec<ChatMessage> {
    let expression = task
        .data
        .get("expression")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let answer = task.reference.answer.clone().unwrap_or_default();
    let call = ToolCall {
        id: "call-0".into(),
        name: "calculator".into(),
        arguments: json!({"expression": expression}).to_string(),
    };
    let mut assistant = ChatMessage::assistant(format!(
        "<tool_call>{{\"name\": \"calculator\", \"arguments\": {}}}</tool_call>",
        call.arguments
    ));
    assistant.extra.insert(
        "tool_calls".into(),
        serde_json::from_value::<TemplateValue>(json!([call.to_openai()])).unwrap_or_default(),
    );
    vec![
        assistant,
        tool_message(&call, answer.clone()),
        ChatMessage::assistant(format!("The answer is {answer}.")),
    ]
}

/// The ideal model turns of [`tool_use_trace`] as raw texts (the call, then the answer), for
/// playing through the environment (`stoke env --demonstrations`).
pub fn expert_turns(task: &EnvTask) -> Vec<String> {
    tool_use_trace(task)
        .into_iter()
        .filter(|message| message.role == Role::Assistant)
        .map(|message| {
            message
                .content
                .map(|content| content.joined_text())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calculator::{evaluate, format_number};

    #[test]
    fn tasks_are_deterministic_and_their_answers_are_right() {
        let spec = ArithmeticSpec { digits: 5, seed: 7 };
        let tasks = arithmetic_tasks(&spec, 50).unwrap();
        assert_eq!(tasks, arithmetic_tasks(&spec, 50).unwrap());
        for task in &tasks {
            let expression = task.data["expression"].as_str().unwrap();
            let exact = format_number(&evaluate(expression).unwrap());
            assert_eq!(task.reference.answer.as_deref(), Some(exact.as_str()));
            assert!(task.prompt.contains(expression));
        }
        let other = arithmetic_tasks(&ArithmeticSpec { digits: 5, seed: 8 }, 50).unwrap();
        assert_ne!(tasks[0].prompt, other[0].prompt);
        assert!(arithmetic_tasks(&ArithmeticSpec { digits: 0, seed: 0 }, 1).is_err());
    }
}
