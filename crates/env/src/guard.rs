//! Environment and tool calls on their own threads, with a timeout and a panic catch: the
//! contract the reward pool keeps for verifiers, kept here for environments.
//!
//! What it is: [`guarded`] runs one closure on a fresh thread and waits at most `timeout` for it.
//! A panic becomes [`EnvError::Panicked`] with the panic message; no answer in time becomes
//! [`EnvError::TimedOut`], and the thread is abandoned (a running thread cannot be stopped; it
//! exits on its own if the call ever returns, and its late answer is dropped). What it is not: a
//! process jail (a tool that runs code uses the sandbox, whose limits stop runaway programs;
//! this timeout is the last line behind them).
//!
//! A fresh thread per call costs tens of microseconds, nothing next to a model turn, and keeps
//! one hung episode from holding a worker that others wait for.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::time::Duration;

use crate::error::EnvError;

/// Runs `call` on its own thread; see the module doc.
pub fn guarded<T, F>(env: &str, timeout: Duration, call: F) -> Result<T, EnvError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, EnvError> + Send + 'static,
{
    let (sender, receiver) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(format!("env-{env}"))
        .spawn(move || {
            let result = catch_unwind(AssertUnwindSafe(call));
            let _ = sender.send(result);
        });
    if let Err(error) = spawned {
        return Err(EnvError::failed(
            env,
            format!("cannot start a thread: {error}"),
        ));
    }
    match receiver.recv_timeout(timeout) {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(EnvError::Panicked {
            env: env.to_string(),
            message: panic_message(panic.as_ref()),
        }),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(EnvError::TimedOut {
            env: env.to_string(),
            seconds: timeout.as_secs_f64(),
        }),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(EnvError::failed(
            env,
            "the call's thread ended without an answer",
        )),
    }
}

/// The text of a panic payload (`&str` or `String`), else a placeholder.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_in_time_is_returned() {
        let value = guarded("t", Duration::from_secs(5), || Ok(41 + 1)).unwrap();
        assert_eq!(value, 42);
    }

    #[test]
    fn a_panic_is_an_error_with_its_message() {
        let error = guarded::<(), _>("t", Duration::from_secs(5), || panic!("boom")).unwrap_err();
        assert_eq!(
            error,
            EnvError::Panicked {
                env: "t".into(),
                message: "boom".into()
            }
        );
    }

    #[test]
    fn a_hang_times_out_and_is_abandoned() {
        let started = std::time::Instant::now();
        let error = guarded::<(), _>("t", Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_secs(30));
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(error, EnvError::TimedOut { .. }));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
