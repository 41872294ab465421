//! How a judge request reaches a server: the narrow [`JudgeTransport`] trait (one chat request
//! to one server, one model listing) and its HTTP implementation over `ureq`
//! ([`HttpTransport`]: `POST {server}/v1/chat/completions`, `GET {server}/v1/models`).
//!
//! What this is not: the choice of server, retries and cooldowns (`servers.rs`), or the
//! request's content (`prompt.rs`). Tests put an in-process fake behind the trait.
//!
//! Invariant: a transport returns the text of `choices[0].message.content` or a
//! [`TransportError`] saying whether another server may succeed ([`TransportError::retryable`]).

use std::time::Duration;

use serde_json::Value;

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// No answer: connection refused, a name that does not resolve, a timeout, a broken
    /// connection.
    Unreachable(String),
    /// The server answered with an HTTP error status.
    Status { code: u16, body: String },
    /// A success status whose body is not a chat completion with text content.
    Malformed(String),
}

impl TransportError {
    /// True when another server (or a later try) may succeed: no answer, 429, 5xx, a garbled
    /// answer. Any other 4xx means the request itself is wrong, and is not retried.
    pub fn retryable(&self) -> bool {
        match self {
            TransportError::Unreachable(_) | TransportError::Malformed(_) => true,
            TransportError::Status { code, .. } => *code == 429 || *code >= 500,
        }
    }
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportError::Unreachable(reason) => write!(f, "no answer: {reason}"),
            TransportError::Status { code, body } => {
                write!(f, "status {code}: {}", crate::verifier::clip_detail(body))
            }
            TransportError::Malformed(reason) => write!(f, "not a chat completion: {reason}"),
        }
    }
}

/// Sends judge requests to OpenAI-compatible servers.
pub trait JudgeTransport: Send + Sync {
    /// `POST {server}/v1/chat/completions` with `body`; the answer's
    /// `choices[0].message.content`.
    fn chat(&self, server: &str, body: &Value, timeout: Duration)
    -> Result<String, TransportError>;

    /// `GET {server}/v1/models`: the served model ids, in the server's order.
    fn models(&self, server: &str, timeout: Duration) -> Result<Vec<String>, TransportError>;
}

/// The text of a chat completion answer.
pub fn chat_content(answer: &Value) -> Result<String, TransportError> {
    answer["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| {
            TransportError::Malformed("no `choices[0].message.content` string".to_string())
        })
}

/// The model ids of a `/v1/models` answer.
pub fn model_ids(answer: &Value) -> Result<Vec<String>, TransportError> {
    let ids: Vec<String> = answer["data"]
        .as_array()
        .map(|data| {
            data.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if ids.is_empty() {
        return Err(TransportError::Malformed(
            "`/v1/models` lists no model".to_string(),
        ));
    }
    Ok(ids)
}

/// [`JudgeTransport`] over HTTP (`ureq`), with an optional bearer key.
pub struct HttpTransport {
    agent: ureq::Agent,
    api_key: Option<String>,
}

impl HttpTransport {
    pub fn new(api_key: Option<String>) -> HttpTransport {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .build()
            .into();
        HttpTransport { agent, api_key }
    }

    fn answer(
        &self,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, TransportError> {
        let unreachable = |e: ureq::Error| TransportError::Unreachable(e.to_string());
        let mut response = response.map_err(unreachable)?;
        let code = response.status().as_u16();
        let text = response.body_mut().read_to_string().map_err(unreachable)?;
        if !(200..300).contains(&code) {
            return Err(TransportError::Status { code, body: text });
        }
        serde_json::from_str(&text).map_err(|e| {
            TransportError::Malformed(format!(
                "not JSON ({e}): {}",
                crate::verifier::clip_detail(&text)
            ))
        })
    }

    fn authorization(&self) -> Option<String> {
        self.api_key.as_ref().map(|key| format!("Bearer {key}"))
    }
}

impl JudgeTransport for HttpTransport {
    fn chat(
        &self,
        server: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<String, TransportError> {
        let mut request = self
            .agent
            .post(&format!("{server}/v1/chat/completions"))
            .config()
            .timeout_global(Some(timeout))
            .build()
            .header("Content-Type", "application/json");
        if let Some(authorization) = self.authorization() {
            request = request.header("Authorization", &authorization);
        }
        let answer = self.answer(request.send(body.to_string()))?;
        chat_content(&answer)
    }

    fn models(&self, server: &str, timeout: Duration) -> Result<Vec<String>, TransportError> {
        let mut request = self
            .agent
            .get(&format!("{server}/v1/models"))
            .config()
            .timeout_global(Some(timeout))
            .build();
        if let Some(authorization) = self.authorization() {
            request = request.header("Authorization", &authorization);
        }
        let answer = self.answer(request.call())?;
        model_ids(&answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn retryable_errors_are_no_answer_429_5xx_and_garbage() {
        assert!(TransportError::Unreachable("refused".into()).retryable());
        assert!(TransportError::Malformed("html".into()).retryable());
        for code in [429, 500, 502, 503] {
            let e = TransportError::Status {
                code,
                body: String::new(),
            };
            assert!(e.retryable(), "{code}");
        }
        for code in [400, 401, 404, 422] {
            let e = TransportError::Status {
                code,
                body: String::new(),
            };
            assert!(!e.retryable(), "{code}");
        }
    }

    #[test]
    fn answers_are_read_from_their_documented_fields() {
        let answer =
            json!({"choices": [{"message": {"role": "assistant", "content": "Score: 7"}}]});
        assert_eq!(chat_content(&answer), Ok("Score: 7".to_string()));
        assert!(chat_content(&json!({"choices": []})).is_err());
        assert!(chat_content(&json!({"choices": [{"message": {"content": null}}]})).is_err());
        let models = json!({"object": "list", "data": [{"id": "judge"}, {"id": "other"}]});
        assert_eq!(model_ids(&models).unwrap(), vec!["judge", "other"]);
        assert!(model_ids(&json!({"data": []})).is_err());
    }
}
