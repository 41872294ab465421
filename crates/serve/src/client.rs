//! A small blocking client of the OpenAI-compatible API (`stoke serve` or vLLM): JSON requests,
//! and server-sent event streams read line by line. Used by `stoke chat --url` and the tests.
//!
//! What it is not: a retrying, load-balancing client for remote rollout (that one belongs to the
//! distributed pipeline); errors come back as they are, with the HTTP status.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use serde_json::Value;

/// A client of one server.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
}

/// A failed exchange: no answer, or an answer that is not what the API promises.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{url}: {message}")]
    Transport { url: String, message: String },
    #[error("{url}: the answer is not JSON: {message}")]
    Body { url: String, message: String },
}

impl Client {
    /// A client of `base_url` (e.g. `http://127.0.0.1:8000`; a trailing `/v1` is kept off).
    pub fn new(base_url: &str) -> Client {
        Client::with_timeout(base_url, None)
    }

    /// A client whose every exchange ends with an error after `timeout` (connecting, sending,
    /// waiting and reading together); `None` waits as long as the server takes.
    pub fn with_timeout(base_url: &str, timeout: Option<Duration>) -> Client {
        let base = base_url
            .trim_end_matches('/')
            .trim_end_matches("/v1")
            .to_string();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_global(timeout)
            .build()
            .into();
        Client { base, agent }
    }

    /// The server's address as given (without a trailing `/v1`).
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// GET `path`: the status and the body as text.
    pub fn get_text(&self, path: &str) -> Result<(u16, String), ClientError> {
        let url = self.url(path);
        let mut response = self
            .agent
            .get(&url)
            .call()
            .map_err(|e| transport(&url, e))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| transport(&url, e))?;
        Ok((status, text))
    }

    /// GET `path` as JSON (`null` for an empty body).
    pub fn get(&self, path: &str) -> Result<(u16, Value), ClientError> {
        let (status, text) = self.get_text(path)?;
        Ok((status, parse(&self.url(path), &text)?))
    }

    /// POST a raw body; the status and the answer as text.
    pub fn post_raw(&self, path: &str, body: &str) -> Result<(u16, String), ClientError> {
        let url = self.url(path);
        let mut response = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(body)
            .map_err(|e| transport(&url, e))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| transport(&url, e))?;
        Ok((status, text))
    }

    /// POST JSON, answer as JSON.
    pub fn post(&self, path: &str, body: &Value) -> Result<(u16, Value), ClientError> {
        let (status, text) = self.post_raw(path, &body.to_string())?;
        Ok((status, parse(&self.url(path), &text)?))
    }

    /// POST a streaming request and hand each `data:` event's JSON to `on_event` until
    /// `[DONE]` (or until `on_event` returns false, which closes the connection). Returns the
    /// status; a non-200 answer's body is handed over as one event.
    pub fn post_stream(
        &self,
        path: &str,
        body: &Value,
        mut on_event: impl FnMut(Value) -> bool,
    ) -> Result<u16, ClientError> {
        let url = self.url(path);
        let mut response = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .map_err(|e| transport(&url, e))?;
        let status = response.status().as_u16();
        if status != 200 {
            let text = response
                .body_mut()
                .read_to_string()
                .map_err(|e| transport(&url, e))?;
            on_event(parse(&url, &text)?);
            return Ok(status);
        }
        let reader = BufReader::new(response.body_mut().as_reader());
        for line in reader.lines() {
            let line = line.map_err(|e| transport(&url, e))?;
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                break;
            }
            if !on_event(parse(&url, data)?) {
                break;
            }
        }
        Ok(status)
    }
}

fn transport(url: &str, error: impl std::fmt::Display) -> ClientError {
    ClientError::Transport {
        url: url.to_string(),
        message: error.to_string(),
    }
}

fn parse(url: &str, text: &str) -> Result<Value, ClientError> {
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(text).map_err(|e| ClientError::Body {
        url: url.to_string(),
        message: format!("{e}: {}", text.chars().take(200).collect::<String>()),
    })
}
