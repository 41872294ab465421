//! [`McpServer`], how to reach an MCP server, and [`McpToolSource`], one live connection to it
//! with the tools it listed.
//!
//! What it is: the connection's life: start (spawn the process or open the HTTP session),
//! `initialize`, the paginated `tools/list`, requests on a private tokio runtime, and shutdown when
//! the last holder drops it. What it is not: the mapping of one tool's call and result
//! ([`super::McpTool`]).
//!
//! A stdio server's stderr is drained into a short tail (its last lines) so that a server that
//! fails to start or dies says why in the error, and a chatty server never blocks on a full pipe;
//! the rest of its log is dropped.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::RunningService;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{Peer, RoleClient, ServiceError, ServiceExt};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio::runtime::Runtime;

use super::tool::McpTool;
use crate::error::EnvError;
use crate::tool::Tool;

/// How long closing a connection may take: a stdio server gets 3 s after its stdin closes, 3 s
/// after SIGTERM, then SIGKILL (rmcp's graceful shutdown); the rest is slack.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for a killed child to be reaped before giving up on it.
const REAP_TIMEOUT: Duration = Duration::from_secs(2);
/// Lines of a stdio server's stderr kept for error messages, and the bytes kept of each.
const STDERR_LINES: usize = 20;
const STDERR_LINE_BYTES: usize = 500;

/// How to reach an MCP server.
#[derive(Clone, Debug, PartialEq, Deserialize, serde::Serialize)]
#[serde(tag = "transport", rename_all = "snake_case", deny_unknown_fields)]
pub enum McpServer {
    /// A child process speaking JSON-RPC on stdin/stdout. It inherits this process's
    /// environment, with `env` added on top.
    Stdio {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    /// A streamable HTTP endpoint, e.g. `http://127.0.0.1:8000/mcp` (plain `http://` only).
    Http { url: String },
}

impl fmt::Display for McpServer {
    /// The command line or the URL; never `env` (it may hold secrets).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            McpServer::Stdio { command, args, .. } => {
                write!(f, "`{command}")?;
                for arg in args {
                    if arg.is_empty() || arg.contains(char::is_whitespace) {
                        write!(f, " {arg:?}")?;
                    } else {
                        write!(f, " {arg}")?;
                    }
                }
                write!(f, "`")
            }
            McpServer::Http { url } => write!(f, "{url}"),
        }
    }
}

impl McpServer {
    /// Rejects what cannot be connected to, naming the field.
    pub fn check(&self) -> Result<(), EnvError> {
        match self {
            McpServer::Stdio { command, .. } if command.trim().is_empty() => {
                Err(EnvError::config("command", "is empty"))
            }
            McpServer::Http { url } if url.starts_with("https://") => Err(EnvError::config(
                "url",
                format!("{url}: https needs a TLS backend, which this build does not have"),
            )),
            McpServer::Http { url } if !url.starts_with("http://") => Err(EnvError::config(
                "url",
                format!("{url}: must start with http://"),
            )),
            _ => Ok(()),
        }
    }
}

/// A connected MCP server and the tools it listed.
pub struct McpToolSource {
    server: McpServer,
    connection: Arc<Connection>,
    tools: Vec<Arc<McpTool>>,
}

impl fmt::Debug for McpToolSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpToolSource")
            .field("server", &self.server.to_string())
            .field(
                "tools",
                &self.tools.iter().map(|t| t.spec().name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl McpToolSource {
    /// Starts or opens `server`, initializes the session and lists every tool (all pages).
    /// `timeout` bounds the whole connection, and then each tool call.
    pub fn connect(server: &McpServer, timeout: Duration) -> Result<McpToolSource, EnvError> {
        server.check()?;
        let label = server.to_string();
        let fail = |message: String| EnvError::Mcp {
            server: label.clone(),
            message,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mcp-client")
            .enable_all()
            .build()
            .map_err(|error| fail(format!("cannot start the client runtime: {error}")))?;
        let stderr = StderrTail::default();
        let started = match server {
            McpServer::Stdio { command, args, env } => {
                let mut process = tokio::process::Command::new(command);
                process.args(args).envs(env);
                let spawned = block_on(&runtime, async {
                    TokioChildProcess::builder(process)
                        .stderr(Stdio::piped())
                        .spawn()
                })
                .map_err(|error| fail(format!("cannot start {command:?}: {error}")))?;
                let (transport, child_stderr) = spawned;
                let pid = transport.id();
                let drained = child_stderr
                    .map(|child_stderr| runtime.spawn(stderr.clone().drain(child_stderr)));
                let client = block_on(&runtime, async {
                    tokio::time::timeout(timeout, ().serve(transport)).await
                });
                match client {
                    Ok(Ok(client)) => Ok((client, pid)),
                    failed => {
                        // The transport was dropped with the failed start, which kills the child;
                        // wait for that so no process outlives the error.
                        if let Some(pid) = pid {
                            block_on(&runtime, wait_reaped(pid));
                        }
                        // The dead child's stderr ends; read it to the end for the message.
                        if let Some(drained) = drained {
                            block_on(&runtime, async {
                                let _ = tokio::time::timeout(REAP_TIMEOUT, drained).await;
                            });
                        }
                        Err(match failed {
                            Ok(Err(error)) => format!("initialize failed: {error}"),
                            _ => format!("no initialize answer within {} s", seconds(timeout)),
                        })
                    }
                }
            }
            McpServer::Http { url } => {
                let client = block_on(&runtime, async {
                    // Built inside the runtime: the transport spawns its worker task at once.
                    let transport = StreamableHttpClientTransport::from_uri(url.as_str());
                    tokio::time::timeout(timeout, ().serve(transport)).await
                });
                match client {
                    Ok(Ok(client)) => Ok((client, None)),
                    Ok(Err(error)) => Err(format!("initialize failed: {error}")),
                    Err(_) => Err(format!(
                        "no initialize answer within {} s",
                        seconds(timeout)
                    )),
                }
            }
        };
        let (client, pid) = started.map_err(|message| fail(message + &stderr.suffix()))?;
        let connection = Arc::new(Connection {
            label: label.clone(),
            timeout,
            pid,
            stderr,
            peer: client.peer().clone(),
            client: Some(client),
            runtime: Some(runtime),
        });
        // On an error below, dropping `connection` shuts the server down.
        let peer = connection.peer.clone();
        let listed = block_on(connection.runtime(), async move {
            tokio::time::timeout(timeout, peer.list_all_tools()).await
        });
        let listed = match listed {
            Ok(Ok(tools)) => tools,
            Ok(Err(error)) => {
                return Err(fail(format!(
                    "tools/list failed: {error}{}",
                    connection.stderr.suffix()
                )));
            }
            Err(_) => {
                return Err(fail(format!(
                    "no tools/list answer within {} s",
                    seconds(timeout)
                )));
            }
        };
        let tools = listed
            .into_iter()
            .map(|tool| Arc::new(McpTool::new(tool, Arc::clone(&connection))))
            .collect();
        Ok(McpToolSource {
            server: server.clone(),
            connection,
            tools,
        })
    }

    pub fn server(&self) -> &McpServer {
        &self.server
    }

    /// The server's tools, in its listing order, for [`crate::ToolEnvironment::new`].
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools
            .iter()
            .map(|tool| Arc::clone(tool) as Arc<dyn Tool>)
            .collect()
    }

    /// The stdio server's process id (`None` over HTTP); for monitoring and tests.
    pub fn process_id(&self) -> Option<u32> {
        self.connection.pid
    }
}

/// One session with a server: the client, its runtime, and what errors need to say.
pub(crate) struct Connection {
    /// The server as errors name it.
    pub(crate) label: String,
    timeout: Duration,
    pid: Option<u32>,
    stderr: StderrTail,
    peer: Peer<RoleClient>,
    /// `Some` until dropped (taken by `Drop` to close on a thread of its own).
    client: Option<RunningService<RoleClient, ()>>,
    runtime: Option<Runtime>,
}

impl Connection {
    fn runtime(&self) -> &Runtime {
        self.runtime
            .as_ref()
            .expect("the runtime is only taken by Drop")
    }

    /// Sends `tools/call` and waits at most the connection's timeout. The error is the reason,
    /// without the server's or the tool's name (the caller adds them).
    pub(crate) fn call_tool(
        &self,
        name: &str,
        arguments: JsonObject,
    ) -> Result<CallToolResult, String> {
        let peer = self.peer.clone();
        let params = CallToolRequestParams::new(name.to_string()).with_arguments(arguments);
        let timeout = self.timeout;
        // A timeout drops the request future, and rmcp then sends `notifications/cancelled`.
        let answer = block_on(self.runtime(), async move {
            tokio::time::timeout(timeout, peer.call_tool(params)).await
        });
        match answer {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(ServiceError::TransportClosed)) => {
                Err(format!("the connection is closed{}", self.stderr.suffix()))
            }
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {} s", seconds(timeout))),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let (Some(mut client), Some(runtime)) = (self.client.take(), self.runtime.take()) else {
            return;
        };
        let pid = self.pid;
        // A runtime can neither be blocked on nor dropped inside another runtime's context, and
        // the last holder may be anywhere; a plain thread can always do both.
        let shutdown = move || {
            let _ = runtime.block_on(client.close_with_timeout(SHUTDOWN_TIMEOUT));
            drop(client);
            if let Some(pid) = pid {
                runtime.block_on(wait_reaped(pid));
            }
            drop(runtime);
        };
        if let Ok(thread) = std::thread::Builder::new()
            .name("mcp-shutdown".into())
            .spawn(shutdown)
        {
            let _ = thread.join();
        }
    }
}

/// Runs `future` to completion on `runtime`, from any thread: inside another tokio runtime's
/// context (where `block_on` would panic) it blocks on a scoped thread instead.
fn block_on<F>(runtime: &Runtime, future: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return runtime.block_on(future);
    }
    std::thread::scope(
        |scope| match scope.spawn(|| runtime.block_on(future)).join() {
            Ok(output) => output,
            Err(panic) => std::panic::resume_unwind(panic),
        },
    )
}

/// Waits (at most [`REAP_TIMEOUT`]) until process `pid` has been killed and reaped by the
/// runtime's cleanup task. Linux only (`/proc`); elsewhere it returns at once.
async fn wait_reaped(pid: u32) {
    let entry = std::path::PathBuf::from(format!("/proc/{pid}"));
    let deadline = tokio::time::Instant::now() + REAP_TIMEOUT;
    while entry.exists() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

/// The last lines a stdio server wrote to stderr.
#[derive(Clone, Default)]
struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    async fn drain(self, stderr: ChildStderr) {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(mut line)) = lines.next_line().await {
            if line.len() > STDERR_LINE_BYTES {
                let mut end = STDERR_LINE_BYTES;
                while !line.is_char_boundary(end) {
                    end -= 1;
                }
                line.truncate(end);
                line.push_str(" [...]");
            }
            let mut tail = self
                .0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if tail.len() == STDERR_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    }

    /// `"; the server's stderr ends:\n..."`, or nothing when it wrote none.
    fn suffix(&self) -> String {
        let tail = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if tail.is_empty() {
            return String::new();
        }
        let lines: Vec<&str> = tail.iter().map(String::as_str).collect();
        format!("; the server's stderr ends:\n{}", lines.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_named_by_its_command_line_without_its_env() {
        let server = McpServer::Stdio {
            command: "python3".into(),
            args: vec!["server.py".into(), "two words".into()],
            env: BTreeMap::from([("API_KEY".to_string(), "secret".to_string())]),
        };
        assert_eq!(server.to_string(), "`python3 server.py \"two words\"`");
        let http = McpServer::Http {
            url: "http://127.0.0.1:8000/mcp".into(),
        };
        assert_eq!(http.to_string(), "http://127.0.0.1:8000/mcp");
    }

    #[test]
    fn a_config_with_an_unknown_key_is_rejected() {
        let parsed: McpServer = serde_json::from_value(serde_json::json!({
            "transport": "stdio", "command": "python3", "args": ["s.py"]
        }))
        .unwrap();
        assert!(matches!(parsed, McpServer::Stdio { ref args, .. } if args == &["s.py"]));
        let error = serde_json::from_value::<McpServer>(serde_json::json!({
            "transport": "http", "url": "http://127.0.0.1:1/mcp", "urls": []
        }))
        .unwrap_err();
        assert!(error.to_string().contains("urls"), "{error}");
    }

    #[test]
    fn unreachable_configs_are_refused_by_field() {
        let empty = McpServer::Stdio {
            command: " ".into(),
            args: vec![],
            env: BTreeMap::new(),
        };
        assert!(matches!(empty.check(), Err(EnvError::Config { key, .. }) if key == "command"));
        for url in ["https://example.invalid/mcp", "127.0.0.1:8000/mcp"] {
            let http = McpServer::Http { url: url.into() };
            assert!(matches!(http.check(), Err(EnvError::Config { key, .. }) if key == "url"));
        }
    }

    #[test]
    fn a_missing_command_is_an_error_naming_it() {
        let server = McpServer::Stdio {
            command: "/nonexistent/stoke-mcp-server".into(),
            args: vec![],
            env: BTreeMap::new(),
        };
        let error = McpToolSource::connect(&server, Duration::from_secs(5)).unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with("MCP server `/nonexistent/stoke-mcp-server`: cannot start"),
            "{text}"
        );
    }

    #[test]
    fn a_server_that_exits_at_once_fails_with_its_stderr() {
        let server = McpServer::Stdio {
            command: "sh".into(),
            args: vec!["-c".into(), "echo no such module >&2; exit 3".into()],
            env: BTreeMap::new(),
        };
        let error = McpToolSource::connect(&server, Duration::from_secs(5)).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("initialize failed"), "{text}");
        assert!(text.contains("no such module"), "{text}");
    }

    #[test]
    fn a_refused_http_connection_names_the_url() {
        // Port 9 (discard) on loopback: nothing listens there on a test machine.
        let server = McpServer::Http {
            url: "http://127.0.0.1:9/mcp".into(),
        };
        let error = McpToolSource::connect(&server, Duration::from_secs(5)).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("MCP server http://127.0.0.1:9/mcp: "),
            "{error}"
        );
    }
}
