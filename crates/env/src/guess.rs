//! Guess the number: a multi-turn environment without tools (TextArena's GuessTheNumber, as in
//! TRL's and verifiers' examples). The secret is an integer in `1..=max`; each model turn is
//! read for its last integer and answered "higher", "lower" or "correct"; a turn without a
//! number is told to answer with one. The episode ends on the right guess, with outcome reward
//! 1, or at the runner's turn limit with 0.
//!
//! What it is: an environment whose episodes are multi-turn by construction, for feedback-driven
//! RL and for testing the multi-turn machinery end to end (any model, even a random one, takes
//! several turns). What it is not: a tool environment (no tool calls are parsed or needed).
//!
//! The secret is the task's gold answer when it is an integer in range, else drawn from the
//! task id (deterministic: a task keeps its secret across samples and runs).

use serde_json::json;
use stoke_tokenizer::chat::ChatMessage;

use crate::environment::{EnvStep, EnvTask, Environment, Episode, ModelTurn, Opening, StopReason};
use crate::error::EnvError;

/// The environment; secrets lie in `1..=max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuessNumber {
    pub max: u64,
}

impl Default for GuessNumber {
    fn default() -> Self {
        GuessNumber { max: 100 }
    }
}

impl GuessNumber {
    /// The secret of `task`.
    pub fn secret(&self, task: &EnvTask) -> u64 {
        let max = self.max.max(1);
        if let Some(answer) = task
            .reference
            .answer
            .as_deref()
            .and_then(|a| a.trim().parse::<u64>().ok())
            .filter(|a| (1..=max).contains(a))
        {
            return answer;
        }
        // FNV-1a of the id: stable across runs and platforms.
        let hash = task.id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        hash % max + 1
    }
}

impl Environment for GuessNumber {
    fn name(&self) -> &str {
        "guess_number"
    }

    fn opening(&self, task: &EnvTask) -> Result<Opening, EnvError> {
        let prompt = if task.prompt.trim().is_empty() {
            format!(
                "I am thinking of a whole number from 1 to {}. Guess it: answer with one number, \
                 and I will say higher or lower.",
                self.max
            )
        } else {
            task.prompt.clone()
        };
        Ok(Opening {
            messages: vec![ChatMessage::user(prompt)],
            tools: Vec::new(),
        })
    }

    fn start(&self, task: &EnvTask) -> Result<Box<dyn Episode>, EnvError> {
        Ok(Box::new(GuessEpisode {
            secret: self.secret(task),
            solved: false,
        }))
    }
}

struct GuessEpisode {
    secret: u64,
    solved: bool,
}

/// The last run of ASCII digits in `text`, as a number.
fn last_number(text: &str) -> Option<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .rfind(|part| !part.is_empty())
        .and_then(|digits| digits.parse().ok())
}

impl Episode for GuessEpisode {
    fn step(&mut self, turn: &ModelTurn<'_>) -> Result<EnvStep, EnvError> {
        let (reply, done) = match last_number(turn.text) {
            None => ("Answer with one whole number.".to_string(), false),
            Some(guess) if guess == self.secret => {
                self.solved = true;
                ("Correct!".to_string(), true)
            }
            Some(guess) if guess < self.secret => (format!("{guess} is too low: higher."), false),
            Some(guess) => (format!("{guess} is too high: lower."), false),
        };
        Ok(EnvStep {
            messages: if done {
                Vec::new()
            } else {
                vec![ChatMessage::user(reply)]
            },
            done,
            metadata: [("guess".to_string(), json!(last_number(turn.text)))]
                .into_iter()
                .collect(),
            ..EnvStep::default()
        })
    }

    fn finish(&mut self, _stop: &StopReason) -> Result<f64, EnvError> {
        Ok(if self.solved { 1.0 } else { 0.0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(text: &str) -> ModelTurn<'_> {
        ModelTurn {
            index: 0,
            text,
            content: Some(text),
            tool_calls: &[],
        }
    }

    #[test]
    fn guesses_are_answered_higher_lower_correct_and_scored_at_the_end() {
        let env = GuessNumber { max: 100 };
        let task = EnvTask {
            id: "t".into(),
            reference: stoke_reward::Reference {
                answer: Some("42".into()),
                ..Default::default()
            },
            ..EnvTask::default()
        };
        assert_eq!(env.secret(&task), 42);
        let mut episode = env.start(&task).unwrap();
        let text = |step: &EnvStep| step.messages[0].content.as_ref().unwrap().joined_text();
        let step = episode.step(&turn("maybe 10?")).unwrap();
        assert!(!step.done && text(&step).contains("higher"));
        let step = episode.step(&turn("I think 50")).unwrap();
        assert!(!step.done && text(&step).contains("lower"));
        let step = episode.step(&turn("no idea")).unwrap();
        assert!(!step.done && text(&step).contains("one whole number"));
        assert_eq!(episode.finish(&StopReason::Done).unwrap(), 0.0);
        let step = episode.step(&turn("42")).unwrap();
        assert!(step.done && step.messages.is_empty());
        assert_eq!(episode.finish(&StopReason::Done).unwrap(), 1.0);
    }

    #[test]
    fn secrets_without_an_answer_come_from_the_id_and_stay_in_range() {
        let env = GuessNumber { max: 10 };
        for i in 0..50 {
            let task = EnvTask {
                id: format!("task-{i}"),
                ..EnvTask::default()
            };
            let secret = env.secret(&task);
            assert!((1..=10).contains(&secret));
            assert_eq!(secret, env.secret(&task));
        }
    }
}
