//! MCP tool sources against the Python `mcp` package's own server (`MCPServer`), on loopback, over
//! both transports: `tests/fixtures/mcp_server.py` offers `add`, `echo`, `fail` and `sleep`.
//!
//! Set-up is the test's own and idempotent: a venv under the cargo target dir with a pinned
//! `mcp` (installed once, reused across runs; nothing global is needed). Where python3, venv or
//! pip (PyPI) is unavailable, each test prints "skipped: <reason>" and returns.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use stoke_env::{
    EnvTask, Environment, McpServer, McpToolSource, ModelTurn, ToolEnvironment, ToolLimits,
};
use stoke_tokenizer::tool_calls::ToolCall;

/// The `mcp` release the fixture is written for (its 2.x `MCPServer` API).
const MCP_VERSION: &str = "2.3.0";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

fn fixture() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp_server.py").to_string()
}

/// The venv's python with `mcp` installed, or why there is none. Installed once per target dir:
/// built under a temporary name and renamed into place, so a run that was cut off or a second
/// `cargo test` running at the same time never sees half a venv (a venv does not record its own
/// path, so it survives the rename). The tests of this binary share one attempt.
fn venv_python() -> Result<PathBuf, String> {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    VENV.get_or_init(install_venv).clone()
}

fn install_venv() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mcp-venv-{MCP_VERSION}"));
    let python = venv.join("bin").join("python");
    if python.exists() {
        return Ok(python);
    }
    let started = Instant::now();
    let system = Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .output()
        .map_err(|error| format!("no python3 ({error})"))?;
    if !system.status.success() {
        return Err(format!(
            "python3 lacks venv/ensurepip: {}",
            String::from_utf8_lossy(&system.stderr).trim()
        ));
    }
    let partial = venv.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    let installed = run(
        "python3 -m venv",
        Command::new("python3").arg("-m").arg("venv").arg(&partial),
    )
    .and_then(|()| {
        run(
            "pip install",
            Command::new(partial.join("bin").join("python")).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--retries",
                "1",
                "--timeout",
                "30",
                &format!("mcp=={MCP_VERSION}"),
            ]),
        )
    });
    if let Err(reason) = installed {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(reason);
    }
    if std::fs::rename(&partial, &venv).is_err() {
        // Another run put its venv in place first; use that one.
        let _ = std::fs::remove_dir_all(&partial);
    }
    if !python.exists() {
        return Err(format!("{} has no bin/python after set-up", venv.display()));
    }
    eprintln!(
        "set up {} with mcp=={MCP_VERSION} in {:.1} s",
        venv.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(python)
}

fn run(what: &str, command: &mut Command) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|error| format!("{what}: {error}"))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
    Err(format!(
        "{what} failed ({}): {}",
        output.status,
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    ))
}

/// The venv's python, or `None` after printing why the test is skipped.
fn python_or_skip(test: &str) -> Option<PathBuf> {
    match venv_python() {
        Ok(python) => Some(python),
        Err(reason) => {
            eprintln!("skipped: {test}: {reason}");
            None
        }
    }
}

fn stdio_server(python: &Path) -> McpServer {
    McpServer::Stdio {
        command: python.display().to_string(),
        args: vec![fixture()],
        env: BTreeMap::new(),
    }
}

/// The HTTP server process; killed and reaped on drop, whatever the test did.
struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start(python: &Path) -> HttpServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        let child = Command::new(python)
            .arg(fixture())
            .arg("http")
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the HTTP server");
        let mut server = HttpServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        };
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("the HTTP server exited before listening: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "the HTTP server did not listen within {CONNECT_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

fn text(message: &stoke_tokenizer::chat::ChatMessage) -> String {
    message.content.as_ref().unwrap().joined_text()
}

/// The episode both transports must drive: the tools reach the opening, `add(2, 3)` answers 5,
/// bad arguments, an unknown tool and a raising tool are failed tool messages, and a turn with
/// no calls ends the episode.
fn drive_episode(source: &McpToolSource) {
    let limits = ToolLimits {
        max_calls_per_turn: 8,
        timeout: CONNECT_TIMEOUT,
        ..ToolLimits::default()
    };
    let env = ToolEnvironment::new("mcp", None, source.tools(), limits).unwrap();
    let task = EnvTask {
        prompt: "What is 2 + 3?".into(),
        ..EnvTask::default()
    };
    let opening = env.opening(&task).unwrap();
    let names: Vec<&str> = opening.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["add", "echo", "fail", "sleep"]);
    let add = &opening.tools[0];
    assert_eq!(add.description, "Add two integers.");
    assert_eq!(add.parameters["properties"]["a"]["type"], "integer");
    assert_eq!(add.parameters["required"], serde_json::json!(["a", "b"]));

    let mut episode = env.start(&task).unwrap();
    let calls = [
        call("call-0", "add", r#"{"a": 2, "b": 3}"#),
        call("call-1", "add", r#"{"a": 2, "b": "three"}"#),
        call("call-2", "multiply", r#"{"a": 2, "b": 3}"#),
        call("call-3", "fail", r#"{"reason": "out of cheese"}"#),
        call("call-4", "echo", r#"{"text": "héllo"}"#),
    ];
    let step = episode
        .step(&ModelTurn {
            index: 0,
            text: "",
            content: None,
            tool_calls: &calls,
        })
        .unwrap();
    assert!(!step.done);
    let texts: Vec<String> = step.messages.iter().map(text).collect();
    let failed: Vec<bool> = step.tool_calls.iter().map(|r| r.failed).collect();
    assert_eq!(texts[0], "5");
    assert_eq!(
        step.messages[0].extra["tool_call_id"].as_str(),
        Some("call-0")
    );
    assert!(texts[1].contains("validation error"), "{}", texts[1]);
    assert!(
        texts[2].contains("unknown tool \"multiply\""),
        "{}",
        texts[2]
    );
    assert!(texts[3].contains("out of cheese"), "{}", texts[3]);
    assert_eq!(texts[4], "héllo");
    assert_eq!(failed, [false, true, true, true, false]);

    let done = episode
        .step(&ModelTurn {
            index: 1,
            text: "5",
            content: Some("5"),
            tool_calls: &[],
        })
        .unwrap();
    assert!(done.done);
}

#[test]
fn a_stdio_server_drives_an_episode_end_to_end() {
    let Some(python) = python_or_skip("a_stdio_server_drives_an_episode_end_to_end") else {
        return;
    };
    let source = McpToolSource::connect(&stdio_server(&python), CONNECT_TIMEOUT).unwrap();
    assert!(source.process_id().is_some());
    drive_episode(&source);
}

#[test]
fn a_streamable_http_server_drives_an_episode_end_to_end() {
    let Some(python) = python_or_skip("a_streamable_http_server_drives_an_episode_end_to_end")
    else {
        return;
    };
    let server = HttpServer::start(&python);
    let config = McpServer::Http {
        url: server.url.clone(),
    };
    let source = McpToolSource::connect(&config, CONNECT_TIMEOUT).unwrap();
    assert_eq!(source.process_id(), None);
    drive_episode(&source);
}

#[test]
fn calls_from_several_threads_share_one_connection() {
    let Some(python) = python_or_skip("calls_from_several_threads_share_one_connection") else {
        return;
    };
    let source = McpToolSource::connect(&stdio_server(&python), CONNECT_TIMEOUT).unwrap();
    let echo = Arc::clone(
        source
            .tools()
            .iter()
            .find(|tool| tool.spec().name == "echo")
            .unwrap(),
    );
    let threads: Vec<_> = (0..8)
        .map(|index| {
            let echo = Arc::clone(&echo);
            std::thread::spawn(move || {
                let arguments = serde_json::json!({"text": format!("thread {index}")});
                echo.call(&arguments, &mut Default::default())
            })
        })
        .collect();
    for (index, thread) in threads.into_iter().enumerate() {
        let output = thread.join().unwrap();
        assert!(!output.failed, "{}", output.content);
        assert_eq!(output.content, format!("thread {index}"));
    }
}

#[test]
fn the_server_process_is_reaped_when_the_source_and_its_tools_are_dropped() {
    let Some(python) =
        python_or_skip("the_server_process_is_reaped_when_the_source_and_its_tools_are_dropped")
    else {
        return;
    };
    if !Path::new("/proc/self").exists() {
        eprintln!("skipped: reaping is checked through /proc, which this system lacks");
        return;
    }
    let source = McpToolSource::connect(&stdio_server(&python), CONNECT_TIMEOUT).unwrap();
    let pid = source.process_id().unwrap();
    let process = PathBuf::from(format!("/proc/{pid}"));
    assert!(process.exists());
    let tools = source.tools();
    drop(source);
    // A tool still holds the connection: the server must still answer.
    let output = tools[0].call(
        &serde_json::json!({"a": 1, "b": 1}),
        &mut Default::default(),
    );
    assert_eq!(output.content, "2");
    let started = Instant::now();
    drop(tools);
    // Gone from /proc means exited and waited for (a zombie keeps its entry).
    assert!(!process.exists(), "server {pid} outlived its source");
    eprintln!(
        "server shut down in {:.2} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_call_past_the_timeout_fails_and_the_connection_lives_on() {
    let Some(python) = python_or_skip("a_call_past_the_timeout_fails_and_the_connection_lives_on")
    else {
        return;
    };
    let timeout = Duration::from_secs(10);
    let source = McpToolSource::connect(&stdio_server(&python), timeout).unwrap();
    let tools = source.tools();
    let tool = |name: &str| tools.iter().find(|tool| tool.spec().name == name).unwrap();
    let started = Instant::now();
    let output = tool("sleep").call(
        &serde_json::json!({"seconds": 120}),
        &mut Default::default(),
    );
    assert!(output.failed);
    assert!(
        output.content.contains("tool sleep: no answer within 10 s"),
        "{}",
        output.content
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    let output = tool("add").call(
        &serde_json::json!({"a": 40, "b": 2}),
        &mut Default::default(),
    );
    assert_eq!(output.content, "42");
}

#[test]
fn a_paginated_tool_list_is_read_to_the_last_page() {
    // Standard-library python only: no venv needed.
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: a_paginated_tool_list_is_read_to_the_last_page: no python3");
        return;
    }
    let server = McpServer::Stdio {
        command: "python3".into(),
        args: vec![
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/paged_mcp_server.py"
            )
            .into(),
        ],
        env: BTreeMap::new(),
    };
    let source = McpToolSource::connect(&server, CONNECT_TIMEOUT).unwrap();
    let tools = source.tools();
    let names: Vec<String> = tools.iter().map(|tool| tool.spec().name).collect();
    assert_eq!(names, ["t0", "t1", "t2", "t3", "t4"]);
    let output = tools[4].call(&serde_json::json!({}), &mut Default::default());
    assert_eq!(output.content, "4");
}

#[test]
fn calls_and_the_last_drop_inside_a_tokio_runtime_do_not_panic() {
    let Some(python) =
        python_or_skip("calls_and_the_last_drop_inside_a_tokio_runtime_do_not_panic")
    else {
        return;
    };
    let caller = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    caller.block_on(async {
        let source = McpToolSource::connect(&stdio_server(&python), CONNECT_TIMEOUT).unwrap();
        let add = &source.tools()[0];
        let output = add.call(
            &serde_json::json!({"a": 1, "b": 2}),
            &mut Default::default(),
        );
        assert_eq!(output.content, "3");
        drop(source);
    });
}
