//! The worker: one OS thread that owns the [`Batcher`] and steps it while there is work, taking
//! commands from the HTTP side between steps.
//!
//! What it is: the bridge between async handlers and the synchronous batcher. Handlers send
//! [`Command`]s (submit requests, swap weights) over a channel and read their tokens from the
//! sinks they passed; the worker publishes its load in [`WorkerState`] after every step.
//! What it is not: HTTP, or a place where requests are validated (the batcher checks what it
//! needs; the routes check the protocol).
//!
//! Pausing (`/pause`) stops stepping: running sequences keep their cache and resume where they
//! were; requests keep arriving and wait. Departed clients are still reaped while paused, so
//! their memory is freed at once.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use stoke_model::Transformer;
use stoke_rollout::{BatchEvent, BatchRequest, Batcher, EventSink, RequestId, RolloutError};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use crate::metrics::Metrics;

/// A request's sink: events of prompt `prompt` go to the handler's channel, tagged.
#[derive(Debug)]
pub struct ChannelSink {
    pub prompt: usize,
    pub events: UnboundedSender<(usize, BatchEvent)>,
}

impl EventSink for ChannelSink {
    fn send(&self, event: BatchEvent) -> bool {
        self.events.send((self.prompt, event)).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.events.is_closed()
    }
}

/// What the HTTP side asks of the worker.
pub enum Command {
    /// Queue the prompts of one API request (all or none).
    Submit {
        requests: Vec<(BatchRequest, ChannelSink)>,
        reply: oneshot::Sender<Result<Vec<RequestId>, RolloutError>>,
    },
    /// Use these weights from the next step on.
    SetWeights {
        model: Arc<Transformer>,
        version: u64,
        checksum: String,
        reply: oneshot::Sender<Result<(), RolloutError>>,
    },
    Shutdown,
}

/// What the worker publishes (read by routes and metrics).
#[derive(Debug, Default)]
pub struct WorkerState {
    pub paused: AtomicBool,
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub prefilling: AtomicUsize,
    pub kv_reserved_bytes: AtomicUsize,
    pub kv_held_bytes: AtomicUsize,
    pub version: AtomicU64,
    /// The checksum of the weights in use (`stoke_model::Transformer::weights_checksum`).
    pub checksum: Mutex<String>,
    /// Steps taken.
    pub steps: AtomicU64,
}

/// The worker thread's handle. Dropping it stops the thread.
#[derive(Debug)]
pub struct Worker {
    commands: Sender<Command>,
    pub state: Arc<WorkerState>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread around `batcher`.
    pub fn start(batcher: Batcher, checksum: String, metrics: Arc<Metrics>) -> Worker {
        let (commands, receiver) = std::sync::mpsc::channel();
        let state = Arc::new(WorkerState::default());
        state.version.store(batcher.version(), Ordering::Relaxed);
        if let Ok(mut slot) = state.checksum.lock() {
            *slot = checksum;
        }
        let kv_budget = batcher.limits().kv_budget_bytes;
        let thread_state = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("stoke-serve-worker".into())
            .spawn(move || run(batcher, receiver, thread_state, metrics, kv_budget))
            .ok();
        Worker {
            commands,
            state,
            thread,
        }
    }

    /// Sends `command`; false if the worker is gone.
    pub fn send(&self, command: Command) -> bool {
        self.commands.send(command).is_ok()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(
    mut batcher: Batcher,
    commands: Receiver<Command>,
    state: Arc<WorkerState>,
    metrics: Arc<Metrics>,
    kv_budget: usize,
) {
    loop {
        let paused = state.paused.load(Ordering::Acquire);
        // Wait for work when there is none (or while paused), else take what has arrived.
        let first = if batcher.is_idle() || paused {
            match commands.recv_timeout(Duration::from_millis(if paused { 5 } else { 50 })) {
                Ok(command) => Some(command),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            commands.try_recv().ok()
        };
        let mut next = first;
        while let Some(command) = next {
            match command {
                Command::Shutdown => return,
                Command::Submit { requests, reply } => {
                    let _ = reply.send(submit_all(&mut batcher, requests));
                }
                Command::SetWeights {
                    model,
                    version,
                    checksum,
                    reply,
                } => {
                    let result = batcher.set_weights(model, version);
                    if result.is_ok() {
                        state.version.store(version, Ordering::Release);
                        metrics.weight_version.set(version as i64);
                        if let Ok(mut slot) = state.checksum.lock() {
                            *slot = checksum;
                        }
                    }
                    let _ = reply.send(result);
                }
            }
            next = commands.try_recv().ok();
        }
        if state.paused.load(Ordering::Acquire) {
            batcher.reap();
        } else if !batcher.is_idle() {
            let report = batcher.step();
            state.steps.fetch_add(1, Ordering::Relaxed);
            if report.decoded > 0 {
                metrics.batch_size.observe(report.decoded as f64);
            }
            metrics.prefill_tokens.inc_by(report.prefill_tokens as u64);
        }
        let load = batcher.load();
        state.running.store(load.running, Ordering::Relaxed);
        state.waiting.store(load.waiting, Ordering::Relaxed);
        state.prefilling.store(load.prefilling, Ordering::Relaxed);
        state
            .kv_reserved_bytes
            .store(load.kv_reserved_bytes, Ordering::Relaxed);
        state
            .kv_held_bytes
            .store(load.kv_held_bytes, Ordering::Relaxed);
        metrics.running.set(load.running as i64);
        metrics.waiting.set((load.waiting + load.prefilling) as i64);
        metrics
            .kv_cache_usage
            .set(load.kv_reserved_bytes as f64 / kv_budget.max(1) as f64);
    }
}

/// Submits every prompt of one API request, or none: a refused prompt cancels the others.
fn submit_all(
    batcher: &mut Batcher,
    requests: Vec<(BatchRequest, ChannelSink)>,
) -> Result<Vec<RequestId>, RolloutError> {
    let mut ids = Vec::with_capacity(requests.len());
    for (request, sink) in requests {
        let prompt = sink.prompt;
        match batcher.submit(request, Box::new(sink)) {
            Ok(id) => ids.push(id),
            Err(error) => {
                for id in ids {
                    batcher.cancel(id);
                }
                return Err(match error {
                    RolloutError::InvalidPrompt { reason, .. } => RolloutError::InvalidPrompt {
                        prompt_index: prompt,
                        reason,
                    },
                    other => other,
                });
            }
        }
    }
    Ok(ids)
}
