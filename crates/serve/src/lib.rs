//! stoke-serve: `stoke serve`, an OpenAI-compatible HTTP server over the rollout engine's
//! continuous batcher, and the blocking client `stoke chat` uses.
//!
//! Modules: [`app`] (configuration and the state every route shares), [`server`] (router,
//! small routes, start/stop), [`protocol`]
//! (request types and their validation), [`generation`] (one request in flight: submission,
//! events folded into choices, text rules), [`completions`] and [`chat`] (the two generation
//! routes' answers, streaming and not), [`stream`] (server-sent events), [`worker`] (the thread
//! that steps the batcher), [`weights`] (loading and checksums for live weight updates),
//! [`metrics`] (Prometheus), [`scoring`] (`--task reward`: a reward model over `/classify`), [`tools`] (the tool-call parser setting and tool warnings), [`client`] (an HTTP client
//! of this API), [`error`] (OpenAI-style error answers).
//!
//! Response shapes follow vLLM's OpenAI server field for field (`../shared/design/anchors.md`
//! §3.3), so its clients (openai, lm-eval's `local-completions`, prime-rl, verifiers) work
//! unchanged; where stoke differs on purpose, `protocol` says so.

pub mod app;
pub mod chat;
pub mod client;
pub mod completions;
pub mod error;
pub mod generation;
pub mod metrics;
pub mod protocol;
pub mod scoring;
pub mod server;
pub mod stream;
pub mod tools;
pub mod weights;
pub mod worker;

pub use app::{ServeConfig, ServeTask};
pub use client::Client;
pub use error::ApiError;
pub use server::{HttpServer, RunningServer, serve};
pub use tools::ToolCallSetting;
pub use weights::weights_checksum;
