//! Model Context Protocol servers as a tool source: every tool an MCP server lists becomes a
//! [`crate::Tool`] whose schema is the server's and whose calls go through the protocol.
//!
//! What it is: [`McpServer`] (how to reach a server: a child process over stdio, or a streamable
//! HTTP endpoint), [`McpToolSource`] (one live connection and the tools it listed) and
//! [`McpTool`] (one of those tools). The client is the official Rust SDK, `rmcp`, driven by a
//! small private tokio runtime per source, so [`crate::Tool::call`] stays synchronous and can be
//! called from any thread.
//!
//! What it is not: an MCP server, a sandbox (a server runs with the rights it was started with;
//! confine it yourself), or a client of resources, prompts, sampling or elicitation (only
//! `tools/list` and `tools/call` are used; a server that asks the client for input during a call
//! gets that call failed). Streamable HTTP is plain `http://`: no TLS backend is built in. The
//! episode's [`crate::Workspace`] is not sent to the server: an MCP tool neither sees nor changes
//! the episode's files (its outputs' `touched` is empty). The session opens with the classic
//! `initialize` handshake, which every protocol revision's servers answer.
//!
//! Invariants:
//! - The tool list is read once, at [`McpToolSource::connect`] (every page of `tools/list`); a
//!   server's later `tools/list_changed` is not followed, so an episode's tools never change
//!   under it (a GRPO group renders one prompt with one tool list).
//! - One connection per source, shared by its tools; calls from several threads are concurrent
//!   requests on it.
//! - The server lives while the source or any of its tools is alive; when the last is dropped the
//!   connection is closed and a stdio server's process is shut down and reaped (stdin closed, then
//!   SIGTERM, then SIGKILL, as the MCP spec's stdio shutdown says).

mod source;
mod tool;

pub use source::{McpServer, McpToolSource};
pub use tool::McpTool;
