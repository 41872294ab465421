//! The two ways of running the four modules over a range of trainer steps.
//!
//! - [`run_sync`]: one thread, each step in turn: take `prompts_per_step` tickets, generate,
//!   score (groups in parallel on the reward pool), add reference log-probs, update, publish.
//!   Every module gets all threads while it runs.
//! - [`run_async`]: one thread per module joined by bounded [`RecordBuffer`]s:
//!
//!   ```text
//!   rollout --A--> reward (2 threads) --B--> inference --C--> trainer (this thread)
//!   ```
//!
//!   (without a reference model the reward threads feed C directly). The rollout thread takes a
//!   permit from the [`StalenessGate`] before every group, so it runs ahead of the trainer by at
//!   most `max_off_policy_steps` versions and blocks there (back-pressure); the trainer pops the
//!   groups of exactly its update slot (buffers pop oldest slot first). Buffers hold
//!   `(k + 1) * prompts_per_step` groups, the most that can be outstanding, within the configured
//!   byte budget, so no buffer can stall the slot the trainer waits for.
//!
//! Group `i` of the session always gets the same task and the same sampling stream
//! ([`TaskPlan`]), whatever the mode: sync and async runs differ only in which weights produced
//! the samples. With a fixed lag (`Lag::Fixed`) those weights are a function of the update slot
//! too, and the trainer takes each batch in group order, so an async run is repeatable.
//!
//! Failure: the first module error is kept, every buffer, the gate and the weight store are
//! closed so all threads wind down, and that error is returned. Per-sample problems (reward
//! panics, timeouts, non-finite updates) are not errors (see `reward` and `learner`); the
//! learner's stop after `max_bad_steps` non-finite updates in a row is, once the sink has
//! recorded that last update.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use stoke_data::epoch::{EpochCursor, Shuffle};

use crate::buffer::{BufferCapacity, RecordBuffer};
use crate::error::PipelineError;
use crate::learner::{Learner, LearnerStep};
use crate::records::{GroupTicket, RolloutGroup, ScoredGroup, Task};
use crate::scheduler::{ComputeModule, ThreadScheduler, each_on_a_thread};
use crate::service::{ReferenceScoring, RewardService, RolloutService};
use crate::settings::TemperatureSchedule;
use crate::staleness::{GenerationPermit, StalenessGate};
use crate::weights::WeightStore;

/// Which task and temperature each group gets: a seeded shuffle of the tasks per epoch (the
/// shared epoch cursor, `seed ^ epoch * golden ratio` seeding each epoch), indexed by the global
/// group number, so the plan needs no state to resume.
#[derive(Clone, Debug)]
pub struct TaskPlan {
    tasks: Vec<Arc<Task>>,
    order: EpochCursor,
    /// Global group number of the session's first permit (`start_step * prompts_per_step`).
    first_group: u64,
    /// Trainer step of the session's update slot 0.
    first_step: u64,
    temperature: TemperatureSchedule,
}

impl TaskPlan {
    pub fn new(
        tasks: Vec<Arc<Task>>,
        seed: u64,
        first_step: u64,
        prompts_per_step: usize,
        temperature: TemperatureSchedule,
    ) -> Result<TaskPlan, PipelineError> {
        if tasks.is_empty() {
            return Err(PipelineError::config("tasks", "no training tasks"));
        }
        Ok(TaskPlan {
            order: EpochCursor::new(
                tasks.len() as u64,
                Shuffle::SeedXorScaledEpoch { seed },
                None,
            ),
            tasks,
            first_group: first_step * prompts_per_step as u64,
            first_step,
            temperature,
        })
    }

    /// The task of global group `group_id`.
    pub fn task(&self, group_id: u64) -> Arc<Task> {
        Arc::clone(&self.tasks[self.order.item_at(group_id) as usize])
    }

    /// The ticket for a permit of this session.
    pub fn ticket(&self, permit: GenerationPermit) -> GroupTicket {
        let group_id = self.first_group + permit.permit_index;
        GroupTicket {
            group_id,
            task: self.task(group_id),
            permit,
            temperature: self.temperature.at(self.first_step + permit.update_slot),
        }
    }
}

/// The modules and joints one session drives. The three modules are traits (`service`), in
/// process or remote; the joints are always the trainer process's own.
pub struct Modules {
    pub rollout: Box<dyn RolloutService>,
    pub rewards: Box<dyn RewardService>,
    pub inference: Arc<Mutex<dyn ReferenceScoring>>,
    pub weights: Arc<WeightStore>,
    pub gate: Arc<StalenessGate>,
    pub scheduler: ThreadScheduler,
}

/// Where each update's wall time went (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTiming {
    /// From the end of the previous update to the end of this one.
    pub wall: f64,
    /// The trainer waiting for its batch.
    pub trainer_waiting: f64,
    pub rollout_busy: f64,
    pub reward_busy: f64,
    pub inference_busy: f64,
    pub trainer_busy: f64,
    /// Publishing the update's weights (part of the trainer's time).
    pub publish: f64,
}

impl StepTiming {
    /// The timing of an update that ended now, `since` the previous one ended; `busy` is
    /// (rollout, reward, inference) seconds of its groups.
    fn measure(
        since: Instant,
        trainer_waiting: f64,
        busy: &(f64, f64, f64),
        update: &LearnerStep,
    ) -> StepTiming {
        StepTiming {
            wall: since.elapsed().as_secs_f64(),
            trainer_waiting,
            rollout_busy: busy.0,
            reward_busy: busy.1,
            inference_busy: busy.2,
            trainer_busy: update.report.seconds,
            publish: update.publish_seconds,
        }
    }
}

/// One finished update as a [`StepSink`] receives it.
pub struct FinishedUpdate<'a> {
    /// The learner after the update.
    pub learner: &'a Learner,
    pub step: LearnerStep,
    pub timing: StepTiming,
    /// The modules, for their statistics (and the evaluation's reward service).
    pub modules: &'a Modules,
}

/// Receives every finished update (metrics, progress, evaluation, checkpoints).
pub trait StepSink {
    fn on_step(&mut self, update: FinishedUpdate<'_>) -> Result<(), PipelineError>;
}

fn busy_of(groups: &[ScoredGroup]) -> (f64, f64, f64) {
    groups.iter().fold((0.0, 0.0, 0.0), |acc, g| {
        (
            acc.0 + g.rollout.generate_seconds,
            acc.1 + g.reward_seconds,
            acc.2 + g.inference_seconds,
        )
    })
}

fn score_all(
    rewards: &dyn RewardService,
    groups: Vec<RolloutGroup>,
) -> Result<Vec<ScoredGroup>, PipelineError> {
    each_on_a_thread(groups, |group| rewards.score(group))
        .into_iter()
        .collect()
}

fn add_reference(
    inference: &Mutex<dyn ReferenceScoring>,
    groups: &mut [ScoredGroup],
) -> Result<(), PipelineError> {
    let inference = inference.lock().unwrap_or_else(PoisonError::into_inner);
    if inference.has_reference() {
        let started = Instant::now();
        inference.add_reference_logprobs(groups)?;
        let share = started.elapsed().as_secs_f64() / groups.len().max(1) as f64;
        for group in groups.iter_mut() {
            group.inference_seconds += share;
        }
    }
    Ok(())
}

/// How much one session drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriveShape {
    /// Updates to run.
    pub steps: u64,
    pub prompts_per_step: usize,
    /// Groups per generation call (async mode).
    pub rollout_batch_groups: usize,
    /// Byte capacity of each buffer (async mode).
    pub buffer_bytes: u64,
}

/// What a drive loop ([`run_sync`], [`run_async`]) runs on: the modules, the learner, the order
/// of the prompts and where finished updates go.
pub struct Drive<'a> {
    pub modules: &'a Modules,
    pub learner: &'a mut Learner,
    pub plan: &'a TaskPlan,
    pub sink: &'a mut dyn StepSink,
}

/// Runs `shape.steps` updates, one module after another.
pub fn run_sync(drive: Drive<'_>, shape: DriveShape) -> Result<(), PipelineError> {
    let modules = drive.modules;
    let DriveShape {
        steps,
        prompts_per_step,
        ..
    } = shape;
    let mut last = Instant::now();
    for _ in 0..steps {
        let mut tickets = Vec::with_capacity(prompts_per_step);
        for _ in 0..prompts_per_step {
            let permit = modules
                .gate
                .acquire()
                .map_err(|_| PipelineError::ModuleStopped {
                    module: "rollout",
                    reason: "the staleness gate closed".into(),
                })?;
            tickets.push(drive.plan.ticket(permit));
        }
        let groups = modules
            .scheduler
            .install(ComputeModule::Rollout, || modules.rollout.generate(tickets))??;
        let mut scored = score_all(&*modules.rewards, groups)?;
        modules.scheduler.install(ComputeModule::Trainer, || {
            add_reference(&modules.inference, &mut scored)
        })??;
        let scored_busy = busy_of(&scored);
        let update = modules
            .scheduler
            .install(ComputeModule::Trainer, || drive.learner.update(scored))??;
        let timing = StepTiming::measure(last, 0.0, &scored_busy, &update);
        record_update(drive.sink, drive.learner, update, timing, modules)?;
        last = Instant::now();
    }
    Ok(())
}

/// Hands a finished update to the sink, then turns the learner's stop request (too many
/// non-finite updates in a row) into the run's error, once the update that made it has been
/// recorded.
fn record_update(
    sink: &mut dyn StepSink,
    learner: &Learner,
    step: LearnerStep,
    timing: StepTiming,
    modules: &Modules,
) -> Result<(), PipelineError> {
    let stop = step.stop.clone();
    sink.on_step(FinishedUpdate {
        learner,
        step,
        timing,
        modules,
    })?;
    match stop {
        Some(reason) => Err(PipelineError::ModuleStopped {
            module: "trainer",
            reason,
        }),
        None => Ok(()),
    }
}

/// The first error of any module, and the switch that stops them all.
struct Shutdown<'a> {
    modules: &'a Modules,
    rollout_out: &'a RecordBuffer<RolloutGroup>,
    scored_out: &'a RecordBuffer<ScoredGroup>,
    trainer_in: &'a RecordBuffer<ScoredGroup>,
    error: Mutex<Option<PipelineError>>,
}

impl Shutdown<'_> {
    fn stop_all(&self) {
        self.modules.gate.close();
        self.modules.weights.close();
        self.rollout_out.close();
        self.scored_out.close();
        self.trainer_in.close();
    }

    fn fail(&self, error: PipelineError) {
        let mut slot = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(error);
        }
        drop(slot);
        self.stop_all();
    }

    fn take_error(&self) -> Option<PipelineError> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Runs `shape.steps` updates with every module on its own thread.
pub fn run_async(drive: Drive<'_>, shape: DriveShape) -> Result<(), PipelineError> {
    let Drive {
        modules,
        learner,
        plan,
        sink,
    } = drive;
    let DriveShape {
        steps,
        prompts_per_step,
        rollout_batch_groups,
        buffer_bytes,
    } = shape;
    let bound = modules.gate.bound();
    let outstanding = bound.max_outstanding_samples() as usize;
    let capacity = BufferCapacity::new(outstanding.max(1), buffer_bytes)
        .map_err(|e| PipelineError::config("buffer_bytes", e.to_string()))?;
    let rollout_out: RecordBuffer<RolloutGroup> = RecordBuffer::new(capacity);
    let scored_out: RecordBuffer<ScoredGroup> = RecordBuffer::new(capacity);
    let trainer_in: RecordBuffer<ScoredGroup> = RecordBuffer::new(capacity);
    let has_reference = modules
        .inference
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .has_reference();
    let shutdown = Shutdown {
        modules,
        rollout_out: &rollout_out,
        scored_out: &scored_out,
        trainer_in: &trainer_in,
        error: Mutex::new(None),
    };
    let total_groups = steps * prompts_per_step as u64;

    let trained = std::thread::scope(|scope| {
        let shutdown = &shutdown;
        let (rollout_out, scored_out, trainer_in) = (&rollout_out, &scored_out, &trainer_in);
        // Rollout: permits -> groups.
        scope.spawn(move || {
            let mut issued = 0u64;
            while issued < total_groups {
                let Ok(first) = modules.gate.acquire() else {
                    return;
                };
                let mut tickets = vec![plan.ticket(first)];
                issued += 1;
                // Extend the batch only with permits granted at once: waiting here while holding
                // permits of an earlier slot could deadlock an on-policy (k = 0) run. Under a
                // fixed lag a batch is a fixed chunk of one slot (its permits are granted at once
                // too), so the engine calls, and with them every rounding, repeat run to run.
                let extend = || {
                    if bound.fixed_lag() {
                        modules.gate.next_slot() == first.update_slot
                    } else {
                        modules.gate.would_admit()
                    }
                };
                while tickets.len() < rollout_batch_groups && issued < total_groups && extend() {
                    let Ok(permit) = modules.gate.acquire() else {
                        return;
                    };
                    tickets.push(plan.ticket(permit));
                    issued += 1;
                }
                let generated = modules
                    .scheduler
                    .install(ComputeModule::Rollout, || modules.rollout.generate(tickets))
                    .and_then(|result| result);
                match generated {
                    Ok(groups) => {
                        for group in groups {
                            if rollout_out.send(group).is_err() {
                                return;
                            }
                        }
                    }
                    Err(error) => {
                        shutdown.fail(error);
                        return;
                    }
                }
            }
        });
        // Reward: two threads so one slow group does not hold up the next.
        for _ in 0..2 {
            scope.spawn(move || {
                let next = if has_reference {
                    scored_out
                } else {
                    trainer_in
                };
                while let Some(group) = rollout_out.pop() {
                    match modules.rewards.score(group) {
                        Ok(scored) => {
                            if next.send(scored).is_err() {
                                return;
                            }
                        }
                        Err(error) => {
                            shutdown.fail(error);
                            return;
                        }
                    }
                }
            });
        }
        // Inference: reference log-probs.
        if has_reference {
            scope.spawn(move || {
                while let Some(group) = scored_out.pop() {
                    let mut groups = vec![group];
                    let added = modules
                        .scheduler
                        .install(ComputeModule::Trainer, || {
                            add_reference(&modules.inference, &mut groups)
                        })
                        .and_then(|result| result);
                    if let Err(error) = added {
                        shutdown.fail(error);
                        return;
                    }
                    for group in groups {
                        if trainer_in.send(group).is_err() {
                            return;
                        }
                    }
                }
            });
        }

        // Trainer: this thread.
        let result = (|| -> Result<(), PipelineError> {
            let mut last = Instant::now();
            for slot in 0..steps {
                let waiting_started = Instant::now();
                let mut batch = Vec::with_capacity(prompts_per_step);
                while batch.len() < prompts_per_step {
                    match trainer_in.pop_at_most(slot) {
                        Some(group) => batch.push(group),
                        None => {
                            return Err(PipelineError::ModuleStopped {
                                module: "trainer",
                                reason: "the pipeline stopped before the batch was complete".into(),
                            });
                        }
                    }
                }
                // Groups arrive in whatever order the reward threads finish them; the update
                // sees them in group order, as in sync mode, so a fixed-lag run repeats exactly.
                batch.sort_by_key(|group| group.rollout.ticket.group_id);
                let trainer_waiting = waiting_started.elapsed().as_secs_f64();
                let batch_busy = busy_of(&batch);
                let update = modules
                    .scheduler
                    .install(ComputeModule::Trainer, || learner.update(batch))??;
                modules
                    .scheduler
                    .rebalance(batch_busy.0, update.report.seconds + batch_busy.2);
                let timing = StepTiming::measure(last, trainer_waiting, &batch_busy, &update);
                record_update(sink, learner, update, timing, modules)?;
                last = Instant::now();
            }
            Ok(())
        })();
        // A module's own error explains a trainer that saw the pipeline stop; keep it first.
        let module_error = shutdown.take_error();
        shutdown.stop_all();
        match (result, module_error) {
            (Err(_), Some(module_error)) => Err(module_error),
            (result, _) => result,
        }
    });
    match (trained, shutdown.take_error()) {
        (Err(error), _) => Err(error),
        (Ok(()), Some(error)) => Err(error),
        (Ok(()), None) => Ok(()),
    }
}
