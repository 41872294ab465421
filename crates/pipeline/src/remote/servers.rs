//! A pool of HTTP servers that do one module's work: routing, per-server in-flight limits,
//! failure handling and the per-server counters.
//!
//! What it is: [`ServerPool::call`] runs one request (a closure over a [`Client`]) on a server
//! chosen by the routing rule among those in rotation with room under `max_in_flight`, waiting
//! while all of them are full. A request that fails (transport error, timeout, an error status,
//! an answer that breaks the API's promises) takes its server out of rotation, logs an alert and
//! is sent whole to another server; its partial work is dropped, so nothing is counted twice. A
//! server out of rotation is probed again after `revive_after` (the caller's probe may also bring
//! it up to date, e.g. load the current weights), and rejoins when the probe passes.
//!
//! What it is not: the request itself (the rollout and reward clients build and check those) or
//! a queue across processes (each trainer process keeps its own pool).
//!
//! Invariants: a request runs on at most one server at a time and on each server at most once;
//! `call` returns the first successful answer or, when no server is left to try, an error naming
//! every server's failure.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use stoke_serve::client::Client;

use crate::error::PipelineError;
use crate::service::{RemoteStats, ServerStats};
use crate::settings::{PoolSettings, Routing};

/// Polls `GET /health` until it answers 200 or `wait` has passed (at least one try).
pub fn wait_until_answering(client: &Client, wait: Duration) -> Result<(), String> {
    let deadline = Instant::now() + wait;
    loop {
        let error = match client.get_text("/health") {
            Ok((200, _)) => return Ok(()),
            Ok((status, _)) => format!("/health answered {status}"),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(error);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What a successful request did, for the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    pub samples: u64,
    pub tokens: u64,
}

struct Slot {
    stats: ServerStats,
    busy_since: Option<Instant>,
    failed_at: Option<Instant>,
}

/// A probe run on a server out of rotation (its index and client); `Ok` brings it back.
pub type Probe = dyn Fn(usize, &Client) -> Result<(), String> + Send + Sync;

/// The plain probe: `GET /health` answers 200.
pub fn health(_index: usize, client: &Client) -> Result<(), String> {
    match client.get_text("/health") {
        Ok((200, _)) => Ok(()),
        Ok((status, _)) => Err(format!("/health answered {status}")),
        Err(e) => Err(e.to_string()),
    }
}

/// N servers of one service (see the module doc).
pub struct ServerPool {
    service: &'static str,
    clients: Vec<Client>,
    settings: PoolSettings,
    slots: Mutex<Vec<Slot>>,
    room: Condvar,
    turn: AtomicUsize,
    retries: AtomicU64,
    started: Instant,
    probe: Box<Probe>,
}

impl std::fmt::Debug for ServerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerPool")
            .field("service", &self.service)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl ServerPool {
    /// A pool over `settings.servers`, all in rotation. `probe` decides whether a failed server
    /// may rejoin.
    pub fn new(service: &'static str, settings: PoolSettings, probe: Box<Probe>) -> ServerPool {
        let clients = settings
            .servers
            .iter()
            .map(|url| Client::with_timeout(url, Some(settings.timeout)))
            .collect();
        let slots = settings
            .servers
            .iter()
            .map(|url| Slot {
                stats: ServerStats {
                    url: url.clone(),
                    alive: true,
                    ..ServerStats::default()
                },
                busy_since: None,
                failed_at: None,
            })
            .collect();
        ServerPool {
            service,
            clients,
            settings,
            slots: Mutex::new(slots),
            room: Condvar::new(),
            turn: AtomicUsize::new(0),
            retries: AtomicU64::new(0),
            started: Instant::now(),
            probe,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn len(&self) -> usize {
        self.clients.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    pub fn client(&self, index: usize) -> &Client {
        &self.clients[index]
    }

    /// Indices of the servers in rotation now.
    pub fn alive(&self) -> Vec<usize> {
        self.lock()
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.stats.alive)
            .map(|(i, _)| i)
            .collect()
    }

    /// Runs `request` (given the server's index and client) on one server after another until
    /// one answers (see the module doc).
    pub fn call<T>(
        &self,
        what: &str,
        request: impl Fn(usize, &Client) -> Result<(T, Work), String>,
    ) -> Result<T, PipelineError> {
        let mut tried: Vec<usize> = Vec::new();
        let mut failures: Vec<String> = Vec::new();
        loop {
            self.revive(&tried);
            let Some(index) = self.acquire(&tried) else {
                return Err(PipelineError::Remote {
                    service: self.service,
                    reason: format!(
                        "{what}: no server left to try ({})",
                        if failures.is_empty() {
                            "every server is out of rotation".to_string()
                        } else {
                            failures.join("; ")
                        }
                    ),
                });
            };
            if !tried.is_empty() {
                self.retries.fetch_add(1, Ordering::Relaxed);
            }
            tried.push(index);
            let answer = request(index, &self.clients[index]);
            match answer {
                Ok((value, work)) => {
                    self.release(index, Ok(work));
                    return Ok(value);
                }
                Err(error) => {
                    failures.push(format!("{}: {error}", self.settings.servers[index]));
                    self.release(index, Err(format!("{what}: {error}")));
                }
            }
        }
    }

    /// Takes a server out of rotation after a failure seen outside `call` (a weight update).
    pub fn mark_failed(&self, index: usize, error: &str) {
        let mut slots = self.lock();
        self.fail_slot(&mut slots[index], error);
        drop(slots);
        self.room.notify_all();
    }

    fn fail_slot(&self, slot: &mut Slot, error: &str) {
        slot.stats.failures += 1;
        slot.stats.last_error = Some(error.to_string());
        if slot.stats.alive {
            eprintln!(
                "alert: {} server {} failed and is out of rotation ({error}); its requests go \
                 to the other servers",
                self.service, slot.stats.url
            );
        }
        slot.stats.alive = false;
        slot.failed_at = Some(Instant::now());
    }

    /// Probes the servers out of rotation whose pause is over (not those in `skip`, which this
    /// request already tried).
    fn revive(&self, skip: &[usize]) {
        let due: Vec<usize> = {
            let mut slots = self.lock();
            let now = Instant::now();
            slots
                .iter_mut()
                .enumerate()
                .filter(|(i, slot)| {
                    !slot.stats.alive
                        && !skip.contains(i)
                        && slot
                            .failed_at
                            .is_some_and(|at| now.duration_since(at) >= self.settings.revive_after)
                })
                .map(|(i, slot)| {
                    // One prober at a time: the next probe is a pause away.
                    slot.failed_at = Some(now);
                    i
                })
                .collect()
        };
        for index in due {
            let probed = (self.probe)(index, &self.clients[index]);
            let mut slots = self.lock();
            let slot = &mut slots[index];
            match probed {
                Ok(()) => {
                    eprintln!(
                        "{} server {} answers again; back in rotation",
                        self.service, slot.stats.url
                    );
                    slot.stats.alive = true;
                    slot.failed_at = None;
                }
                Err(error) => {
                    slot.stats.last_error = Some(format!("probe: {error}"));
                }
            }
            drop(slots);
            self.room.notify_all();
        }
    }

    /// A server in rotation, not in `exclude`, with room; waits while every candidate is full.
    /// `None` when no candidate is in rotation.
    fn acquire(&self, exclude: &[usize]) -> Option<usize> {
        let mut slots = self.lock();
        loop {
            let candidates: Vec<usize> = (0..slots.len())
                .filter(|i| slots[*i].stats.alive && !exclude.contains(i))
                .collect();
            if candidates.is_empty() {
                return None;
            }
            let free: Vec<usize> = candidates
                .iter()
                .copied()
                .filter(|&i| slots[i].stats.in_flight < self.settings.max_in_flight)
                .collect();
            if !free.is_empty() {
                let turn = self.turn.fetch_add(1, Ordering::Relaxed);
                let n = slots.len();
                // In turn order starting at `turn`, so ties rotate.
                let mut ordered = free.clone();
                ordered.sort_by_key(|&i| (i + n - turn % n) % n);
                let index = match self.settings.routing {
                    Routing::RoundRobin => ordered[0],
                    Routing::LeastLoaded => *ordered
                        .iter()
                        .min_by_key(|&&i| slots[i].stats.in_flight)
                        .unwrap_or(&ordered[0]),
                };
                let slot = &mut slots[index];
                if slot.stats.in_flight == 0 {
                    slot.busy_since = Some(Instant::now());
                }
                slot.stats.in_flight += 1;
                return Some(index);
            }
            slots = self
                .room
                .wait_timeout(slots, Duration::from_millis(200))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn release(&self, index: usize, result: Result<Work, String>) {
        let mut slots = self.lock();
        let slot = &mut slots[index];
        slot.stats.in_flight -= 1;
        if slot.stats.in_flight == 0
            && let Some(since) = slot.busy_since.take()
        {
            slot.stats.busy_seconds += since.elapsed().as_secs_f64();
        }
        match result {
            Ok(work) => {
                slot.stats.requests += 1;
                slot.stats.samples += work.samples;
                slot.stats.tokens += work.tokens;
            }
            Err(error) => self.fail_slot(slot, &error),
        }
        drop(slots);
        self.room.notify_all();
    }

    /// The counters now.
    pub fn stats(&self) -> RemoteStats {
        let slots = self.lock();
        RemoteStats {
            servers: slots
                .iter()
                .map(|slot| {
                    let mut stats = slot.stats.clone();
                    if let Some(since) = slot.busy_since {
                        stats.busy_seconds += since.elapsed().as_secs_f64();
                    }
                    stats
                })
                .collect(),
            retries: self.retries.load(Ordering::Relaxed),
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Barrier};

    fn pool(n: usize, routing: Routing, max_in_flight: usize) -> ServerPool {
        ServerPool::new(
            "test",
            PoolSettings {
                servers: (0..n)
                    .map(|i| format!("http://127.0.0.1:{}", 9 + i))
                    .collect(),
                routing,
                max_in_flight,
                timeout: Duration::from_secs(1),
                revive_after: Duration::from_secs(3600),
                startup_wait: Duration::ZERO,
            },
            Box::new(|_, _| Err("down".into())),
        )
    }

    #[test]
    fn a_failed_server_rejoins_once_its_probe_passes() {
        let probed = Arc::new(AtomicUsize::new(0));
        let pool = ServerPool::new(
            "test",
            PoolSettings {
                servers: vec!["http://127.0.0.1:9".into(), "http://127.0.0.1:10".into()],
                routing: Routing::RoundRobin,
                max_in_flight: 1,
                timeout: Duration::from_secs(1),
                revive_after: Duration::ZERO,
                startup_wait: Duration::ZERO,
            },
            {
                let probed = Arc::clone(&probed);
                Box::new(move |index, _| {
                    probed.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(index, 0, "only the failed server is probed");
                    Ok(())
                })
            },
        );
        let failing = AtomicUsize::new(1);
        pool.call("r", |i, _| {
            if i == 0 && failing.swap(0, Ordering::SeqCst) == 1 {
                Err("once".into())
            } else {
                Ok(((), Work::default()))
            }
        })
        .unwrap();
        assert_eq!(pool.alive(), [1]);
        // The next request probes it first (its pause is 0) and may use it again.
        pool.call("r", |_, _| Ok(((), Work::default()))).unwrap();
        assert_eq!(probed.load(Ordering::SeqCst), 1);
        assert_eq!(pool.alive(), [0, 1]);
    }

    #[test]
    fn round_robin_takes_servers_in_turn() {
        let pool = pool(3, Routing::RoundRobin, 4);
        let order: Vec<usize> = (0..6)
            .map(|_| pool.call("r", |i, _| Ok((i, Work::default()))).unwrap())
            .collect();
        assert_eq!(order, [0, 1, 2, 0, 1, 2]);
        let stats = pool.stats();
        assert!(
            stats
                .servers
                .iter()
                .all(|s| s.requests == 2 && s.in_flight == 0)
        );
    }

    #[test]
    fn least_loaded_avoids_the_busy_server() {
        let pool = Arc::new(pool(2, Routing::LeastLoaded, 4));
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let held = {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                pool.call("held", |i, _| {
                    wait.recv().unwrap();
                    Ok((i, Work::default()))
                })
                .unwrap()
            })
        };
        while pool.stats().servers.iter().all(|s| s.in_flight == 0) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let busy = pool
            .stats()
            .servers
            .iter()
            .position(|s| s.in_flight == 1)
            .unwrap();
        for _ in 0..3 {
            let chosen = pool.call("r", |i, _| Ok((i, Work::default()))).unwrap();
            assert_ne!(chosen, busy, "a request went to the busy server");
        }
        release.send(()).unwrap();
        assert_eq!(held.join().unwrap(), busy);
    }

    #[test]
    fn the_in_flight_limit_holds_under_load() {
        let pool = Arc::new(pool(2, Routing::LeastLoaded, 2));
        let peak = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let now = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let start = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (pool, peak, now, start) = (
                    Arc::clone(&pool),
                    Arc::clone(&peak),
                    Arc::clone(&now),
                    Arc::clone(&start),
                );
                std::thread::spawn(move || {
                    start.wait();
                    pool.call("r", |i, _| {
                        let running = now[i].fetch_add(1, Ordering::SeqCst) + 1;
                        peak[i].fetch_max(running, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        now[i].fetch_sub(1, Ordering::SeqCst);
                        Ok((
                            i,
                            Work {
                                samples: 1,
                                tokens: 3,
                            },
                        ))
                    })
                    .unwrap()
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        for p in peak.iter() {
            assert!(
                p.load(Ordering::SeqCst) <= 2,
                "max_in_flight is 2 per server"
            );
        }
        let stats = pool.stats();
        assert_eq!(stats.servers.iter().map(|s| s.requests).sum::<u64>(), 8);
        assert_eq!(stats.servers.iter().map(|s| s.tokens).sum::<u64>(), 24);
    }

    #[test]
    fn a_failure_moves_the_request_and_takes_the_server_out() {
        let pool = pool(3, Routing::RoundRobin, 1);
        let tries = AtomicUsize::new(0);
        let served = pool
            .call("r", |i, _| {
                tries.fetch_add(1, Ordering::SeqCst);
                if i == 0 {
                    Err("boom".into())
                } else {
                    Ok((i, Work::default()))
                }
            })
            .unwrap();
        assert_eq!((served, tries.load(Ordering::SeqCst)), (1, 2));
        assert_eq!(pool.alive(), [1, 2]);
        let stats = pool.stats();
        assert_eq!(stats.retries, 1);
        assert_eq!(stats.servers[0].failures, 1);
        assert!(
            stats.servers[0]
                .last_error
                .as_deref()
                .unwrap()
                .contains("boom")
        );
        // Every server failing: an error naming each, not a hang.
        let error = pool
            .call("r", |_, _| Err::<((), Work), _>("no".into()))
            .unwrap_err();
        let text = error.to_string();
        assert!(text.contains("no server left to try"), "{text}");
        assert!(pool.alive().is_empty());
    }
}
