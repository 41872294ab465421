//! Test doubles for the judge: an in-process [`FakeJudge`] transport that answers with a
//! function of the request's messages and records what it saw, and an honest grader that
//! reads the exact nonce-delimited quotes and scores them by a marker (`GOOD`) they contain.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;

use super::prompt::Messages;
use super::transport::{JudgeTransport, TransportError};

type AnswerFn = dyn Fn(&str, &Messages) -> Result<String, TransportError> + Send + Sync;

/// A judge server in the process: `answer(server, messages)` is its reply.
pub struct FakeJudge {
    answer: Box<AnswerFn>,
    pub models: Vec<String>,
    pub delay: Duration,
    pub calls: AtomicUsize,
    pub model_calls: AtomicUsize,
    in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub bodies: Mutex<Vec<Value>>,
}

impl FakeJudge {
    pub fn new(
        answer: impl Fn(&str, &Messages) -> Result<String, TransportError> + Send + Sync + 'static,
    ) -> FakeJudge {
        FakeJudge {
            answer: Box::new(answer),
            models: vec!["fake-judge".to_string()],
            delay: Duration::ZERO,
            calls: AtomicUsize::new(0),
            model_calls: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            bodies: Mutex::new(Vec::new()),
        }
    }

    /// An honest judge (see [`honest_answer`]).
    pub fn honest() -> FakeJudge {
        FakeJudge::new(|_, messages| Ok(honest_answer(messages)))
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl JudgeTransport for FakeJudge {
    fn chat(
        &self,
        server: &str,
        body: &Value,
        _timeout: Duration,
    ) -> Result<String, TransportError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        self.bodies.lock().unwrap().push(body.clone());
        let messages = Messages {
            system: body["messages"][0]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            user: body["messages"][1]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        };
        let answer = (self.answer)(server, &messages);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        answer
    }

    fn models(&self, _server: &str, _timeout: Duration) -> Result<Vec<String>, TransportError> {
        self.model_calls.fetch_add(1, Ordering::SeqCst);
        Ok(self.models.clone())
    }
}

/// The nonce of a prompt built by `prompt.rs` (its user message opens with the prompt quote).
pub fn nonce_of(user: &str) -> Option<String> {
    let rest = user.strip_prefix("<prompt-")?;
    Some(rest[..rest.find('>')?].to_string())
}

/// The quotes of a hardened prompt, read by their exact delimiters: (tag, body).
pub fn exact_blocks(user: &str) -> Vec<(String, String)> {
    let Some(nonce) = nonce_of(user) else {
        return Vec::new();
    };
    let mut blocks = Vec::new();
    let mut rest = user;
    let close_of = |tag: &str| format!("</{tag}-{nonce}>");
    while let Some(start) = rest.find('<') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('>') else { break };
        let name = &after[..end];
        match name.strip_suffix(&format!("-{nonce}")) {
            Some(tag) if !tag.starts_with('/') => {
                let body_start = &after[end + 1..];
                let close = close_of(tag);
                let Some(close_at) = body_start.find(&close) else {
                    break;
                };
                let body = body_start[..close_at].trim_matches('\n').to_string();
                blocks.push((tag.to_string(), body));
                rest = &body_start[close_at + close.len()..];
            }
            _ => rest = after,
        }
    }
    blocks
}

/// How good a quoted text is, honestly: how many `GOOD` markers it holds.
pub fn marker_count(text: &str) -> usize {
    text.matches("GOOD").count()
}

/// Grades by markers inside the exact quotes: pointwise `Score: 1 + markers` (at most 10),
/// pairwise the response with more markers, listwise by markers (ties by label).
pub fn honest_answer(messages: &Messages) -> String {
    let blocks = exact_blocks(&messages.user);
    let responses: Vec<(String, usize)> = blocks
        .iter()
        .filter_map(|(tag, body)| {
            tag.strip_prefix("response").map(|label| {
                (
                    label.trim_start_matches('-').to_string(),
                    marker_count(body),
                )
            })
        })
        .collect();
    honest_verdict(&responses)
}

/// The honest verdict over (label, markers) of the responses shown: one unlabelled response
/// is pointwise, `A` and `B` pairwise, numbers listwise.
pub fn honest_verdict(responses: &[(String, usize)]) -> String {
    let labels: Vec<&str> = responses.iter().map(|(l, _)| l.as_str()).collect();
    match (labels.as_slice(), responses) {
        ([""], [(_, count)]) => format!("Looks fine.\nScore: {}", (1 + count).min(10)),
        (["A", "B"], [(_, a), (_, b)]) => {
            let verdict = match a.cmp(b) {
                std::cmp::Ordering::Greater => "A",
                std::cmp::Ordering::Less => "B",
                std::cmp::Ordering::Equal => "tie",
            };
            format!("Compared.\nVerdict: {verdict}")
        }
        _ if !responses.is_empty() && labels.iter().all(|l| l.parse::<usize>().is_ok()) => {
            let mut order: Vec<&(String, usize)> = responses.iter().collect();
            order.sort_by(|x, y| {
                let label = |l: &str| l.parse::<usize>().unwrap_or(0);
                y.1.cmp(&x.1).then(label(&x.0).cmp(&label(&y.0)))
            });
            let labels: Vec<&str> = order.iter().map(|(l, _)| l.as_str()).collect();
            format!("Ranked.\nRanking: {}", labels.join(" > "))
        }
        _ => "I cannot find the response.".to_string(),
    }
}
