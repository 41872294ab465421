//! A `stoke serve` process over the tiny Qwen2 fixture for the CLI tests that need a server
//! (stopped by SIGINT in `stop`, killed if a test fails first).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The tiny Qwen2 fixture: random weights, a Qwen chat template, 128 positions.
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

/// A `stoke serve` process on a free loopback port, and its URL (read from its first line).
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Server {
    pub fn start() -> Server {
        Server::serve(&fixture_dir(), "tiny", None)
    }

    /// `stoke serve` of `model` (relative to `dir` when given) as `name`, on a small KV cache.
    pub fn serve(model: &std::path::Path, name: &str, dir: Option<&std::path::Path>) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_stoke"));
        command.args(["serve", "--model"]).arg(model);
        command.args([
            "--port",
            "0",
            "--served-model-name",
            name,
            "--kv-cache-gib",
            "0.25",
        ]);
        if let Some(dir) = dir {
            command.current_dir(dir).stdout(Stdio::null());
        }
        Server::spawn(command)
    }

    /// Any server command (`stoke serve`, `stoke reward-server`) whose first line on stderr that
    /// is not a warning names its URL.
    pub fn spawn(mut command: Command) -> Server {
        let mut child = command
            .stderr(Stdio::piped())
            .spawn()
            .expect("the server starts");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        // The URL line may follow warnings about the config (a deprecated key, say).
        let mut before = Vec::new();
        let url = loop {
            let mut line = String::new();
            let read = stderr.read_line(&mut line).unwrap();
            if let Some(url) = line
                .split_whitespace()
                .find(|word| word.starts_with("http://"))
            {
                break url.to_string();
            }
            assert!(
                read > 0 && before.len() < 20,
                "no URL in the server's first lines: {before:?}"
            );
            before.push(line);
        };
        // Keep draining stderr so the server never blocks on it.
        std::thread::spawn(move || for _ in stderr.lines() {});
        Server { child, url }
    }

    /// SIGINT, as Ctrl-C; the server must exit cleanly.
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-INT", &pid]).status().unwrap();
        assert!(status.success());
        let exit = self.child.wait().unwrap();
        assert!(exit.success(), "stoke serve exited with {exit}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
