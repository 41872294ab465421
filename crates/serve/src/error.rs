//! The server's errors, answered as OpenAI-style error objects:
//! `{"error": {"message", "type", "param", "code"}}` (the shape vLLM returns too), with the HTTP
//! status that says whose fault it was.
//!
//! Invariant: every handler failure becomes one of these; nothing a client sends can panic the
//! server or close the connection without an answer.

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// Seconds a client should wait before retrying (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// A 400 naming `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.into()),
            retry_after: None,
        }
    }

    /// A 400 about the request as a whole (its body is not JSON, ...).
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    pub fn status(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// The queue is full: 429 with `Retry-After`.
    pub fn overloaded(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            param: None,
            retry_after: Some(1),
        }
    }

    /// Something failed inside the server (500).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// OpenAI's error `type` for the status.
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 422 => "BadRequestError",
            404 => "NotFoundError",
            405 => "MethodNotAllowedError",
            409 => "ConflictError",
            413 => "RequestTooLargeError",
            415 => "UnsupportedMediaTypeError",
            429 => "RateLimitError",
            503 => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorBody {
            error: ErrorObject {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        })
        .unwrap_or_default()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.param {
            Some(param) => write!(f, "{} ({param}): {}", self.status, self.message),
            None => write!(f, "{}: {}", self.status, self.message),
        }
    }
}

impl std::error::Error for ApiError {}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: u16,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after
            && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

/// A body that could not be read (too large, cut off) as an error object rather than axum's text.
impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> ApiError {
        ApiError::status(rejection.status(), rejection.body_text())
    }
}

/// The answer to a known route called with a method it does not serve: 405 with an error object
/// (axum adds the `Allow` header naming the methods it does serve).
pub async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    ApiError::status(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "method {method} is not allowed on {} (the Allow header names those that are)",
            uri.path()
        ),
    )
    .into_response()
}

impl From<stoke_rollout::RolloutError> for ApiError {
    fn from(error: stoke_rollout::RolloutError) -> ApiError {
        use stoke_rollout::RolloutError;
        match &error {
            RolloutError::InvalidParam { field, .. } => {
                // The engine's names for the protocol's fields.
                let param = match *field {
                    "max_new_tokens" => "max_tokens",
                    "stop_strings" => "stop",
                    other => other,
                };
                ApiError::invalid(param, error.to_string())
            }
            RolloutError::InvalidPrompt { .. } => ApiError::invalid("prompt", error.to_string()),
            _ => ApiError::internal(error.to_string()),
        }
    }
}
