//! The reward module: the run's verifiers behind a fixed pool of worker threads that survives
//! verifiers that panic or hang.
//!
//! What it is: [`RewardPool::score`] takes one [`RolloutGroup`] and returns it as a
//! [`ScoredGroup`], one [`SampleReward`] per sample. Each sample is one job (a group-level reward,
//! such as `group_length` or a composite containing it, is one job for the whole group, since it
//! compares the samples with each other). Jobs run in parallel on `workers` threads fed by one
//! channel; several callers may score groups at once (the pool is `Send + Sync`).
//!
//! What it is not: the verifiers themselves (`stoke_reward`), or the process jail for code
//! rewards (`stoke_sandbox`, whose own limits stop a runaway program; the pool's timeout is the
//! last line behind it, for verifiers that block in ways the sandbox does not see).
//!
//! Failure handling, the reason this file exists:
//! - A verifier that panics is caught (`catch_unwind`) and its samples get
//!   `SampleReward::failed(Panicked(message))`; the worker thread carries on.
//! - A verifier that has not answered `timeout` after a worker *started* it gets
//!   `failed(TimedOut)`. A running thread cannot be stopped, so it is abandoned: a replacement
//!   worker is spawned so the pool keeps `workers` live threads, and the abandoned thread exits
//!   on its own if its verifier ever returns (its late answer is dropped). Time a job spends
//!   queued behind busy workers is not charged to it: under load, a slow-but-correct verifier is
//!   not failed because other jobs were ahead of it.
//! - A task whose reward index is out of range fails all its samples with a `Panicked` failure
//!   naming the index (the indexing bug a panic would have reported), never a panic.
//!
//! Invariants: `score` returns one reward per sample, in sample order; every score is finite;
//! a failed sample's score is 0; the live worker count is `workers` after every `score` call
//! (unless the OS refuses new threads, which is reported by [`RewardPool::live_workers`]).

use std::collections::BTreeMap;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use stoke_reward::{Reward, RewardInput, RewardOutcome, Verifier};

use crate::error::PipelineError;
use crate::records::{RewardFailure, RolloutGroup, SampleReward, ScoredGroup};

/// One configured reward, as the pool runs it.
#[derive(Clone)]
pub struct RewardSpec {
    /// The name tasks refer to it by (`[rewards.NAME]`), for logs.
    pub name: String,
    pub verifier: Arc<dyn Verifier>,
    /// Score the whole group in one `score_group` call (rewards that compare samples within a
    /// group); else one job per sample.
    pub group_level: bool,
    /// A `process_reward` with `dense = true`: its step scores also shape the token advantages
    /// (`dense_process`).
    pub dense_process: bool,
}

impl RewardSpec {
    /// A built `stoke_reward` reward; group-level exactly when the reward says so.
    pub fn from_reward(name: String, reward: Reward) -> RewardSpec {
        let group_level = reward.is_group_level();
        let dense_process = reward.is_dense_process();
        RewardSpec {
            name,
            verifier: Arc::new(reward),
            group_level,
            dense_process,
        }
    }
}

impl std::fmt::Debug for RewardSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardSpec")
            .field("name", &self.name)
            .field("group_level", &self.group_level)
            .finish_non_exhaustive()
    }
}

/// Counters since the pool was created. Counts are in samples, except `abandoned_workers`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RewardPoolStats {
    /// Samples that got their verifier's verdict.
    pub scored: u64,
    /// Samples whose verifier panicked.
    pub panics: u64,
    /// Samples whose verifier did not answer within the timeout.
    pub timeouts: u64,
    /// Samples whose task named a reward index the pool does not have.
    pub unknown_reward: u64,
    /// Worker threads given up on because their verifier hung (each was replaced).
    pub abandoned_workers: u64,
    /// Wall time spent inside verifiers, summed over workers (abandoned jobs count up to the
    /// moment they were abandoned).
    pub busy_seconds: f64,
}

/// Where a job stands; the worker and the waiting caller move it forward under its mutex, so
/// exactly one of "the worker delivered" and "the caller gave up" happens.
enum JobPhase {
    Queued,
    Running {
        since: Instant,
        worker: usize,
    },
    Done,
    /// The caller stopped waiting; the worker running it must exit when (if) it returns.
    Abandoned,
}

struct Job {
    index: usize,
    verifier: Arc<dyn Verifier>,
    group_level: bool,
    group: Arc<RolloutGroup>,
    samples: Range<usize>,
    phase: Arc<Mutex<JobPhase>>,
    results: Sender<JobResult>,
}

struct JobResult {
    index: usize,
    /// One outcome per sample of the job, or the panic message.
    verdicts: Result<Vec<RewardOutcome>, String>,
}

/// What the worker threads share with the pool.
struct Shared {
    queue: Mutex<Receiver<Job>>,
    stats: Mutex<RewardPoolStats>,
    handles: Mutex<BTreeMap<usize, JoinHandle<()>>>,
    next_worker: AtomicUsize,
}

/// The reward module: verifiers on a fixed-size pool of threads.
pub struct RewardPool {
    specs: Vec<RewardSpec>,
    workers: usize,
    timeout: Duration,
    jobs: Option<Sender<Job>>,
    shared: Arc<Shared>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked while holding it; the data (phases,
    // counters, handles) stays consistent because every critical section is a plain assignment.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RewardPool {
    /// `workers` threads (at least 1) scoring with `specs` (at least one; index 0 is the
    /// default reward); a verifier running longer than `timeout` (more than zero) is abandoned.
    // PipelineError's size is the crate's (error.rs) to shrink, for every module at once.
    pub fn new(
        specs: Vec<RewardSpec>,
        workers: usize,
        timeout: Duration,
    ) -> Result<RewardPool, PipelineError> {
        if specs.is_empty() {
            return Err(PipelineError::config(
                "rewards",
                "at least one reward is needed",
            ));
        }
        if workers == 0 {
            return Err(PipelineError::config(
                "grpo.reward_workers",
                "must be at least 1",
            ));
        }
        if timeout.is_zero() {
            return Err(PipelineError::config(
                "grpo.reward_timeout",
                "must be more than zero",
            ));
        }
        let (jobs, queue) = mpsc::channel();
        let pool = RewardPool {
            specs,
            workers,
            timeout,
            jobs: Some(jobs),
            shared: Arc::new(Shared {
                queue: Mutex::new(queue),
                stats: Mutex::new(RewardPoolStats::default()),
                handles: Mutex::new(BTreeMap::new()),
                next_worker: AtomicUsize::new(0),
            }),
        };
        pool.ensure_workers()
            .map_err(|e| PipelineError::ModuleStopped {
                module: "reward",
                reason: format!("could not start a worker thread: {e}"),
            })?;
        Ok(pool)
    }

    /// Scores every sample of `group` with the reward its task names. Never panics and never
    /// waits on a hung verifier longer than the timeout (see the module doc).
    pub fn score(&self, group: RolloutGroup) -> ScoredGroup {
        let started = Instant::now();
        let sample_count = group.samples.len();
        let reward_index = group.ticket.task.reward;
        let Some(spec) = self.specs.get(reward_index) else {
            let reason = format!(
                "task `{}` asks for reward index {reward_index}, but only {} rewards are configured",
                group.ticket.task.id,
                self.specs.len()
            );
            lock(&self.shared.stats).unknown_reward += sample_count as u64;
            let rewards = vec![SampleReward::failed(RewardFailure::Panicked(reason)); sample_count];
            return ScoredGroup::new(group, rewards, started.elapsed().as_secs_f64());
        };
        if sample_count == 0 {
            return ScoredGroup::new(group, Vec::new(), started.elapsed().as_secs_f64());
        }
        // Top up first: a replacement that the OS refused last time gets another chance.
        let _ = self.ensure_workers();

        let group = Arc::new(group);
        let ranges: Vec<Range<usize>> = if spec.group_level {
            let whole_group = 0..sample_count;
            vec![whole_group]
        } else {
            (0..sample_count).map(|i| i..i + 1).collect()
        };
        let (results_tx, results) = mpsc::channel();
        let mut phases = Vec::with_capacity(ranges.len());
        let mut verdicts: Vec<Option<Result<Vec<RewardOutcome>, RewardFailure>>> =
            vec![None; ranges.len()];
        for (index, samples) in ranges.iter().enumerate() {
            let phase = Arc::new(Mutex::new(JobPhase::Queued));
            phases.push(Arc::clone(&phase));
            let job = Job {
                index,
                verifier: Arc::clone(&spec.verifier),
                group_level: spec.group_level,
                group: Arc::clone(&group),
                samples: samples.clone(),
                phase,
                results: results_tx.clone(),
            };
            let sent = self
                .jobs
                .as_ref()
                .is_some_and(|jobs| jobs.send(job).is_ok());
            if !sent {
                verdicts[index] = Some(Err(RewardFailure::Panicked(
                    "the reward pool is shut down".into(),
                )));
            }
        }
        drop(results_tx);
        self.collect(&results, &phases, &mut verdicts);

        let mut rewards = Vec::with_capacity(sample_count);
        let mut counts = RewardPoolStats::default();
        for (verdict, samples) in verdicts.into_iter().zip(&ranges) {
            match verdict {
                Some(Ok(outcomes)) => {
                    counts.scored += outcomes.len() as u64;
                    rewards.extend(outcomes.into_iter().map(sample_reward));
                }
                Some(Err(failure)) => {
                    match failure {
                        RewardFailure::TimedOut => counts.timeouts += samples.len() as u64,
                        // Environment failures are applied after scoring, never by a verifier.
                        RewardFailure::Panicked(_) | RewardFailure::Environment(_) => {
                            counts.panics += samples.len() as u64
                        }
                    }
                    rewards.extend(std::iter::repeat_n(
                        SampleReward::failed(failure),
                        samples.len(),
                    ));
                }
                None => {
                    // `collect` leaves no job without a verdict; this arm only keeps the
                    // function total.
                    counts.panics += samples.len() as u64;
                    rewards.extend(std::iter::repeat_n(
                        SampleReward::failed(RewardFailure::Panicked("no verdict".into())),
                        samples.len(),
                    ));
                }
            }
        }
        {
            let mut stats = lock(&self.shared.stats);
            stats.scored += counts.scored;
            stats.panics += counts.panics;
            stats.timeouts += counts.timeouts;
        }
        // An abandoned job may still hold the group; then the caller gets a copy.
        let group = Arc::try_unwrap(group).unwrap_or_else(|shared| (*shared).clone());
        ScoredGroup::new(group, rewards, started.elapsed().as_secs_f64())
    }

    /// Waits until every job has a verdict: delivered, failed by panic, or timed out.
    fn collect(
        &self,
        results: &Receiver<JobResult>,
        phases: &[Arc<Mutex<JobPhase>>],
        verdicts: &mut [Option<Result<Vec<RewardOutcome>, RewardFailure>>],
    ) {
        loop {
            // Abandon every running job past its deadline and find the next deadline. Jobs
            // still queued have none yet: any that starts after now has its deadline more than
            // `timeout` away, so sleeping `timeout` never oversleeps one.
            let now = Instant::now();
            let mut next_deadline = now + self.timeout;
            let mut pending = 0;
            for (index, phase) in phases.iter().enumerate() {
                if verdicts[index].is_some() {
                    continue;
                }
                let mut phase = lock(phase);
                match *phase {
                    JobPhase::Running { since, worker } => {
                        let deadline = since + self.timeout;
                        if deadline <= now {
                            *phase = JobPhase::Abandoned;
                            drop(phase);
                            verdicts[index] = Some(Err(RewardFailure::TimedOut));
                            self.abandon_worker(worker, now.duration_since(since));
                            continue;
                        }
                        next_deadline = next_deadline.min(deadline);
                    }
                    // Abandoned jobs already have their verdict and are skipped above.
                    JobPhase::Queued | JobPhase::Done | JobPhase::Abandoned => {}
                }
                pending += 1;
            }
            if pending == 0 {
                return;
            }
            if self.live_workers() == 0 {
                // Every thread is gone and none could be started: nothing will run the queue.
                // The jobs are marked abandoned so a worker started later skips them.
                for (verdict, phase) in verdicts.iter_mut().zip(phases) {
                    if verdict.is_none() {
                        *lock(phase) = JobPhase::Abandoned;
                        *verdict = Some(Err(RewardFailure::Panicked(
                            "no reward worker thread is running".into(),
                        )));
                    }
                }
                return;
            }
            match results.recv_timeout(next_deadline.saturating_duration_since(Instant::now())) {
                Ok(result) => {
                    verdicts[result.index] = Some(result.verdicts.map_err(RewardFailure::Panicked));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    // Every job's sender is gone: each was delivered or dropped unrun.
                    for verdict in verdicts.iter_mut().filter(|v| v.is_none()) {
                        *verdict = Some(Err(RewardFailure::Panicked(
                            "the job was dropped before a worker ran it".into(),
                        )));
                    }
                    return;
                }
            }
        }
    }

    /// Gives up on `worker` (hung in a verifier) and starts its replacement.
    fn abandon_worker(&self, worker: usize, busy: Duration) {
        // Dropping the handle detaches the thread: nobody joins a thread that may never return.
        lock(&self.shared.handles).remove(&worker);
        {
            let mut stats = lock(&self.shared.stats);
            stats.abandoned_workers += 1;
            stats.busy_seconds += busy.as_secs_f64();
        }
        let _ = self.ensure_workers();
    }

    /// Starts threads until `workers` are live. Retried on the next call when the OS refuses;
    /// `collect` fails the jobs if no thread is left at all.
    fn ensure_workers(&self) -> std::io::Result<()> {
        // Checked and filled under one lock, so two callers replacing at once do not overshoot.
        let mut handles = lock(&self.shared.handles);
        while handles.len() < self.workers {
            spawn_worker(&self.shared, &mut handles)?;
        }
        Ok(())
    }

    /// Worker threads currently serving the queue (abandoned ones excluded).
    pub fn live_workers(&self) -> usize {
        lock(&self.shared.handles).len()
    }

    pub fn stats(&self) -> RewardPoolStats {
        *lock(&self.shared.stats)
    }

    pub fn specs(&self) -> &[RewardSpec] {
        &self.specs
    }

    /// Stops the workers and waits for them (abandoned threads are not waited for).
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for RewardPool {
    fn drop(&mut self) {
        // Closing the queue ends each idle worker's `recv`; jobs still queued belong to no
        // caller (every `score` call has returned) and are skipped as the channel drains.
        self.jobs = None;
        let handles = std::mem::take(&mut *lock(&self.shared.handles));
        for (_, handle) in handles {
            let _ = handle.join();
        }
    }
}

fn spawn_worker(
    shared: &Arc<Shared>,
    handles: &mut BTreeMap<usize, JoinHandle<()>>,
) -> std::io::Result<()> {
    let id = shared.next_worker.fetch_add(1, Ordering::Relaxed);
    let worker_shared = Arc::clone(shared);
    let handle = std::thread::Builder::new()
        .name(format!("stoke-reward-{id}"))
        .spawn(move || worker_loop(&worker_shared, id))?;
    handles.insert(id, handle);
    Ok(())
}

fn worker_loop(shared: &Shared, worker: usize) {
    loop {
        let job = match lock(&shared.queue).recv() {
            Ok(job) => job,
            Err(_) => return, // the pool is shut down
        };
        let since = Instant::now();
        {
            let mut phase = lock(&job.phase);
            if !matches!(*phase, JobPhase::Queued) {
                continue;
            }
            *phase = JobPhase::Running { since, worker };
        }
        let verdicts = catch_unwind(AssertUnwindSafe(|| run_job(&job)))
            .unwrap_or_else(|payload| Err(panic_message(payload.as_ref())));
        let busy = since.elapsed().as_secs_f64();
        {
            let mut phase = lock(&job.phase);
            if matches!(*phase, JobPhase::Abandoned) {
                // Replaced already; the answer is too late to matter.
                return;
            }
            *phase = JobPhase::Done;
        }
        lock(&shared.stats).busy_seconds += busy;
        // Release the group before answering, so the caller gets it back without a copy.
        drop(job.group);
        // The caller is waiting (it only stops on a verdict, and this job is not abandoned).
        let _ = job.results.send(JobResult {
            index: job.index,
            verdicts,
        });
    }
}

/// Runs the verifier on the job's samples: one outcome per sample, or why not.
fn run_job(job: &Job) -> Result<Vec<RewardOutcome>, String> {
    let task = &job.group.ticket.task;
    let inputs: Vec<RewardInput<'_>> = job.group.samples[job.samples.clone()]
        .iter()
        .map(|sample| {
            RewardInput::new(&task.prompt, &sample.text, &task.reference)
                .with_tokens(sample.model_tokens())
        })
        .collect();
    let outcomes = if job.group_level {
        job.verifier.score_group(&inputs)
    } else {
        inputs
            .iter()
            .map(|input| job.verifier.score(input))
            .collect()
    };
    if outcomes.len() != inputs.len() {
        return Err(format!(
            "the verifier returned {} outcomes for {} samples",
            outcomes.len(),
            inputs.len()
        ));
    }
    Ok(outcomes)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_string()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "the verifier panicked with a non-text payload".to_string()
    }
}

/// The verifier's verdict as the pipeline records it. `stoke_reward` already zeroes non-finite
/// scores; this guards verifiers from elsewhere, since one NaN poisons a group's advantages.
fn sample_reward(outcome: RewardOutcome) -> SampleReward {
    let finite = |score: f64| if score.is_finite() { score } else { 0.0 };
    SampleReward {
        score: finite(outcome.score),
        outcome: outcome.outcome,
        components: outcome
            .details
            .components
            .iter()
            .map(|component| (component.name.clone(), finite(component.score)))
            .collect(),
        failure: None,
        judge: outcome.details.judge,
        steps: outcome.details.steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<RewardPool>();
        assert_send_sync::<RewardSpec>();
    }

    #[test]
    fn panic_messages_are_kept() {
        let text = catch_unwind(|| panic!("bad {}", 7)).unwrap_err();
        assert_eq!(panic_message(text.as_ref()), "bad 7");
        let literal = catch_unwind(|| std::panic::panic_any("plain")).unwrap_err();
        assert_eq!(panic_message(literal.as_ref()), "plain");
    }

    #[test]
    fn non_finite_scores_become_zero() {
        let outcome = RewardOutcome {
            score: f64::NAN,
            outcome: stoke_reward::Outcome::Shaped,
            details: stoke_reward::Details {
                components: vec![stoke_reward::ComponentScore {
                    name: "length".into(),
                    weight: 1.0,
                    score: f64::INFINITY,
                    outcome: stoke_reward::Outcome::Shaped,
                    applied: true,
                }],
                ..Default::default()
            },
        };
        let reward = sample_reward(outcome);
        assert_eq!(reward.score, 0.0);
        assert_eq!(reward.components, vec![("length".to_string(), 0.0)]);
    }

    #[test]
    fn bad_settings_are_rejected() {
        assert!(RewardPool::new(Vec::new(), 2, Duration::from_secs(1)).is_err());
    }
}
