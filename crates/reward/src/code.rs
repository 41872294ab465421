//! What the code rewards share: pulling code out of a completion (```python fences), a
//! per-run random nonce, mapping a sandbox `ExecResult` to a verdict, and running many programs
//! at once on the sandbox's worker pool.
//!
//! What this is not: the jail. Isolation, limits and timeouts are `stoke-sandbox`'s; this module
//! only decides what a finished run means.

use rand::Rng;
use stoke_sandbox::{ExecResult, ExitStatusKind, Program, Sandbox};

use crate::verifier::Outcome;

/// The code of a completion: the last ```python (or ```py / ```python3) fenced block; else the
/// last untagged ``` block; else the completion itself.
pub fn extract_code(completion: &str) -> &str {
    let mut tagged: Option<&str> = None;
    let mut untagged: Option<&str> = None;
    let mut rest = completion;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let Some(newline) = after.find('\n') else {
            break;
        };
        let tag = after[..newline].trim().to_ascii_lowercase();
        let body = &after[newline + 1..];
        let Some(close) = body.find("```") else {
            // An unclosed fence (completion cut at the length limit): take what is there.
            if matches!(tag.as_str(), "python" | "py" | "python3") {
                tagged = Some(body);
            }
            break;
        };
        let block = &body[..close];
        match tag.as_str() {
            "python" | "py" | "python3" => tagged = Some(block),
            "" => untagged = Some(block),
            _ => {}
        }
        rest = &body[close + 3..];
    }
    tagged.or(untagged).unwrap_or(completion)
}

/// A fresh random token the program under test cannot predict.
pub fn nonce() -> String {
    let value: u128 = rand::rng().random();
    format!("stoke-{value:032x}")
}

/// The verdict a run's status implies when it did not finish normally, if any.
pub fn abnormal_outcome(result: &ExecResult) -> Option<(Outcome, String)> {
    match &result.status {
        ExitStatusKind::TimedOut => Some((Outcome::Timeout, "wall-clock limit".into())),
        ExitStatusKind::CpuLimit => Some((Outcome::Timeout, "CPU-time limit".into())),
        ExitStatusKind::OutputLimit => Some((Outcome::SandboxError, "output limit".into())),
        ExitStatusKind::SandboxError(message) => Some((Outcome::SandboxError, message.clone())),
        // SIGXCPU (24 on Linux): RLIMIT_CPU's soft limit, when reported as a signal.
        ExitStatusKind::Signaled(24) => Some((Outcome::Timeout, "CPU-time limit (SIGXCPU)".into())),
        ExitStatusKind::Exited(_) | ExitStatusKind::Signaled(_) => None,
    }
}

/// Runs every program on the sandbox at once (the sandbox admits `workers` at a time) and
/// returns the results in order. Blocking; uses one short-lived thread per program, because
/// `run_blocking` parks its caller until the program ends.
pub fn run_all(sandbox: &Sandbox, programs: Vec<Program>) -> Vec<ExecResult> {
    if programs.len() == 1 {
        return programs
            .into_iter()
            .map(|p| sandbox.run_blocking(p))
            .collect();
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = programs
            .into_iter()
            .map(|program| scope.spawn(move || sandbox.run_blocking(program)))
            .collect();
        handles
            .into_iter()
            .map(|handle| match handle.join() {
                Ok(result) => result,
                // A panic in the sandbox client is a bug there; report it as a sandbox error
                // for this program rather than aborting the whole batch.
                Err(_) => failed_run(sandbox),
            })
            .collect()
    })
}

fn failed_run(sandbox: &Sandbox) -> ExecResult {
    ExecResult {
        status: ExitStatusKind::SandboxError("sandbox client thread panicked".into()),
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        wall_time: std::time::Duration::ZERO,
        cpu_time: None,
        max_rss_kib: None,
        isolation: sandbox.isolation().clone(),
        files: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_fence_is_preferred_and_last_one_wins() {
        let text = "```\nuntagged\n```\n```python\nfirst\n```\ntext\n```python\nsecond\n```";
        assert_eq!(extract_code(text), "second\n");
    }

    #[test]
    fn untagged_fence_then_raw_completion() {
        assert_eq!(extract_code("see\n```\nx = 1\n```"), "x = 1\n");
        assert_eq!(extract_code("    return a + b\n"), "    return a + b\n");
        assert_eq!(
            extract_code("```rust\nfn main(){}\n```"),
            "```rust\nfn main(){}\n```"
        );
    }

    #[test]
    fn unclosed_python_fence_keeps_its_body() {
        assert_eq!(
            extract_code("```python\ndef f():\n    return 1\n"),
            "def f():\n    return 1\n"
        );
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
    }
}
