//! The judge's servers: which one a request goes to, retries on the next one, and a cooldown
//! for servers that just failed.
//!
//! The rule: requests go round robin over the servers. A request that gets no answer, a 429 or
//! a 5xx (or a garbled answer) is tried again on the next server, up to `retries` more times.
//! A server that failed so is skipped by every request for the cooldown (30 s in a run), so a
//! dead judge server costs one failed attempt per cooldown, not one per request; when every
//! server is cooling down, the one whose cooldown ends first is tried anyway. Any other 4xx
//! fails at once: the request is wrong and another server would say the same.
//!
//! What this is not: HTTP (`transport.rs`). Shared by every clone of a verifier.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::transport::TransportError;

/// How long a server that failed is skipped in a run.
pub const COOLDOWN: Duration = Duration::from_secs(30);

/// What one logical request cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Attempts {
    /// Further attempts after the first.
    pub retries: u64,
    /// Servers passed over because they were cooling down.
    pub skipped: u64,
    /// Wall seconds over all attempts.
    pub seconds: f64,
}

/// The servers and their cooldowns.
#[derive(Debug)]
pub struct ServerPool {
    servers: Vec<String>,
    cooldown: Duration,
    state: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    next: usize,
    failed_until: Vec<Option<Instant>>,
}

impl ServerPool {
    /// `servers` must not be empty (the config checks it).
    pub fn new(servers: Vec<String>, cooldown: Duration) -> ServerPool {
        let count = servers.len();
        ServerPool {
            servers,
            cooldown,
            state: Mutex::new(PoolState {
                next: 0,
                failed_until: vec![None; count],
            }),
        }
    }

    /// Runs `attempt` on one server after another (module doc) until it succeeds, fails for
    /// good or `retries` further attempts have failed; the error names the server and why.
    pub fn call<T>(
        &self,
        retries: usize,
        attempts: &mut Attempts,
        mut attempt: impl FnMut(&str) -> Result<T, TransportError>,
    ) -> Result<T, String> {
        if self.servers.is_empty() {
            return Err("no judge server is configured".to_string());
        }
        let mut last_error = String::new();
        for try_number in 0..=retries {
            if try_number > 0 {
                attempts.retries += 1;
            }
            let index = self.pick(&mut attempts.skipped);
            let server = &self.servers[index];
            let started = Instant::now();
            let result = attempt(server);
            attempts.seconds += started.elapsed().as_secs_f64();
            match result {
                Ok(value) => {
                    self.set_failed(index, None);
                    return Ok(value);
                }
                Err(error) if error.retryable() => {
                    self.set_failed(index, Some(Instant::now() + self.cooldown));
                    last_error = format!("{server}: {error}");
                }
                Err(error) => return Err(format!("{server} refused the request: {error}")),
            }
        }
        Err(format!(
            "the judge gave no answer in {} attempt(s); last: {last_error}",
            retries + 1
        ))
    }

    /// The next server in turn that is not cooling down (counting those passed over), or the
    /// one whose cooldown ends first.
    fn pick(&self, skipped: &mut u64) -> usize {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let count = self.servers.len();
        let now = Instant::now();
        let start = state.next;
        let mut chosen = None;
        for offset in 0..count {
            let index = (start + offset) % count;
            match state.failed_until[index] {
                Some(until) if until > now => *skipped += 1,
                _ => {
                    chosen = Some(index);
                    break;
                }
            }
        }
        let index = chosen.unwrap_or_else(|| {
            // All cooling down: the one back soonest is tried (it was not really skipped).
            *skipped = skipped.saturating_sub(1);
            (0..count)
                .min_by_key(|&i| state.failed_until[i])
                .unwrap_or(0)
        });
        state.next = (index + 1) % count;
        index
    }

    fn set_failed(&self, index: usize, until: Option<Instant>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.failed_until[index] = until;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(servers: &[&str]) -> ServerPool {
        ServerPool::new(servers.iter().map(|s| s.to_string()).collect(), COOLDOWN)
    }

    fn down() -> TransportError {
        TransportError::Unreachable("connection refused".into())
    }

    #[test]
    fn requests_go_round_robin() {
        let pool = pool(&["a", "b", "c"]);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let server = pool
                .call(0, &mut Attempts::default(), |s| {
                    Ok::<_, TransportError>(s.to_string())
                })
                .unwrap();
            seen.push(server);
        }
        assert_eq!(seen, ["a", "b", "c", "a"]);
    }

    #[test]
    fn a_failed_server_is_retried_on_the_next_then_skipped() {
        let pool = pool(&["dead", "live"]);
        let mut attempts = Attempts::default();
        let mut tried = Vec::new();
        let answer = pool
            .call(2, &mut attempts, |s| {
                tried.push(s.to_string());
                if s == "dead" { Err(down()) } else { Ok(7) }
            })
            .unwrap();
        assert_eq!(answer, 7);
        assert_eq!(tried, ["dead", "live"]);
        assert_eq!(attempts.retries, 1);
        assert_eq!(attempts.skipped, 0);
        // The next requests pass the dead server over without trying it.
        for _ in 0..3 {
            let mut attempts = Attempts::default();
            let mut tried = Vec::new();
            pool.call(2, &mut attempts, |s| {
                tried.push(s.to_string());
                Ok::<_, TransportError>(())
            })
            .unwrap();
            assert_eq!(tried, ["live"]);
            assert_eq!(attempts.retries, 0);
            assert!(attempts.skipped <= 1);
        }
    }

    #[test]
    fn retries_are_bounded_and_the_error_names_the_server() {
        let pool = pool(&["a", "b"]);
        let mut attempts = Attempts::default();
        let mut count = 0;
        let error = pool
            .call(3, &mut attempts, |_| {
                count += 1;
                Err::<(), _>(TransportError::Status {
                    code: 503,
                    body: "overloaded".into(),
                })
            })
            .unwrap_err();
        assert_eq!(count, 4, "one attempt and three retries");
        assert_eq!(attempts.retries, 3);
        assert!(
            error.contains("4 attempt") && error.contains("overloaded"),
            "{error}"
        );
    }

    #[test]
    fn a_client_error_is_not_retried() {
        let pool = pool(&["a", "b"]);
        let mut attempts = Attempts::default();
        let mut count = 0;
        let error = pool
            .call(5, &mut attempts, |_| {
                count += 1;
                Err::<(), _>(TransportError::Status {
                    code: 400,
                    body: "bad model".into(),
                })
            })
            .unwrap_err();
        assert_eq!(count, 1);
        assert_eq!(attempts.retries, 0);
        assert!(
            error.contains("400") && error.contains("bad model"),
            "{error}"
        );
    }

    #[test]
    fn when_every_server_cools_down_one_is_still_tried() {
        let pool = pool(&["a", "b"]);
        let _ = pool.call(1, &mut Attempts::default(), |_| Err::<(), _>(down()));
        let mut tried = 0;
        let mut attempts = Attempts::default();
        let answer = pool.call(0, &mut attempts, |_| {
            tried += 1;
            Ok::<_, TransportError>(1)
        });
        assert_eq!(answer, Ok(1));
        assert_eq!(tried, 1);
        assert_eq!(attempts.skipped, 1, "the other server was passed over");
    }
}
