//! The error type of the Hugging Face tokenizer and chat-template modules (`hf`, `chat`).
//!
//! Every variant that comes from a file names the file; config problems also name the field, and
//! malformed JSON carries the line and column serde_json reported. Template errors carry the
//! template's name and the message of `raise_exception` (or minijinja's own message) unchanged, so
//! a user sees "Conversation roles must alternate ..." rather than a generic failure.
//! Not used by the `train` and `metrics` modules, which have their own errors.

use std::path::PathBuf;

use stoke_types::TokenId;

/// What went wrong while loading a tokenizer directory, encoding, decoding or rendering a chat.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file the tokenizer needs is not there (only `tokenizer.json` is required).
    #[error("missing file {path}: a Hugging Face tokenizer directory needs it")]
    MissingFile { path: PathBuf },

    /// A file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON file is not valid JSON, or does not have the shape the reader expects.
    #[error("malformed JSON in {path} at line {line}, column {column}: {message}")]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },

    /// A config field holds a value that is well-formed JSON but cannot be used, such as a special
    /// token that is not in the vocabulary.
    #[error("{path}: field `{field}`: {message}")]
    Field {
        path: PathBuf,
        field: String,
        message: String,
    },

    /// The `tokenizers` crate failed to encode a text.
    /// A GGUF file whose tokenizer metadata cannot be read (the message names file and key).
    #[error("{message}")]
    Gguf { message: String },
    #[error("encoding failed: {message}")]
    Encode { message: String },

    /// The `tokenizers` crate failed to decode ids that are all in the vocabulary.
    #[error("decoding failed: {message}")]
    Decode { message: String },

    /// A token id that the vocabulary does not contain was given to a decode.
    #[error("token id {id} is not in the vocabulary (vocabulary size {vocab_size})")]
    UnknownTokenId { id: TokenId, vocab_size: usize },

    /// The tokenizer directory has no chat template (neither `chat_template.jinja` nor a
    /// `chat_template` field in `tokenizer_config.json`), or not one with the requested name.
    #[error("no chat template{}", name.as_ref().map(|n| format!(" named `{n}`")).unwrap_or_default())]
    NoChatTemplate { name: Option<String> },

    /// A chat template failed to compile, or raised an error while rendering (including the
    /// template's own `raise_exception(...)` calls, whose message is kept verbatim).
    #[error("chat template `{template}`: {message}")]
    Template { template: String, message: String },

    /// The assistant mask could not be computed for this template and conversation.
    #[error("assistant mask for chat template `{template}`: {message}")]
    AssistantMask { template: String, message: String },
}

impl TokenizerError {
    /// Wraps a serde_json error for `path`, keeping its line and column.
    pub(crate) fn json(path: impl Into<PathBuf>, err: &serde_json::Error) -> Self {
        // serde_json's Display appends " at line L column C"; the variant prints those itself.
        let full = err.to_string();
        let suffix = format!(" at line {} column {}", err.line(), err.column());
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
        TokenizerError::Json {
            path: path.into(),
            line: err.line(),
            column: err.column(),
            message,
        }
    }
}
