//! Sharing the CPU's threads between the modules that compute: generation (rollout) and the
//! policy update (trainer, which also runs the inference module's scoring passes).
//!
//! How: every module runs its tensor work inside [`ThreadScheduler::install`], which executes it
//! on a rayon pool of the size currently allotted to that module. candle's matrix products
//! (gemm's `Parallelism::Rayon`) and stoke's fused kernels split their work over the *current*
//! rayon pool, so the allotment bounds how many cores a module's kernels occupy.
//!
//! The allotment follows measured demand. After every trainer update the scheduler receives
//! each module's busy seconds over that update (time spent computing, not waiting on a buffer
//! or the staleness gate) and splits `threads` in proportion to them, each module keeping at
//! least one thread: a module that keeps the other waiting gets more cores. In synchronous mode
//! the modules never overlap, so each gets all threads ([`ThreadScheduler::exclusive`]).
//!
//! What it is not: an OS-level CPU pinning, or a scheduler of work items (the buffers and the
//! gate order the work). candle's own element-wise pool is not governed by it.
//!
//! Invariants: in shared mode, the allotments are each >= 1 and sum to `max(threads, 2)`;
//! pools are built once per (module, size) and reused.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::PipelineError;

/// `work` on every item, each on a thread of its own, results in item order; a panic on one of
/// the threads is raised again here. For work that waits (verifiers, HTTP requests), not for
/// tensor work, which the rayon pools above share out.
pub fn each_on_a_thread<I: Send, T: Send>(
    items: impl IntoIterator<Item = I>,
    work: impl Fn(I) -> T + Sync,
) -> Vec<T> {
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || work(item)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// The modules that get threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ComputeModule {
    Rollout,
    Trainer,
}

impl ComputeModule {
    pub const ALL: [ComputeModule; 2] = [ComputeModule::Rollout, ComputeModule::Trainer];

    pub fn name(self) -> &'static str {
        match self {
            ComputeModule::Rollout => "rollout",
            ComputeModule::Trainer => "trainer",
        }
    }
}

/// Threads per module at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allotment {
    pub rollout: usize,
    pub trainer: usize,
}

impl Allotment {
    pub fn of(&self, module: ComputeModule) -> usize {
        match module {
            ComputeModule::Rollout => self.rollout,
            ComputeModule::Trainer => self.trainer,
        }
    }
}

#[derive(Debug)]
struct SchedulerState {
    allotment: Allotment,
    pools: BTreeMap<(ComputeModule, usize), Arc<rayon::ThreadPool>>,
}

/// Hands each module a rayon pool sized by its share of the threads.
#[derive(Debug)]
pub struct ThreadScheduler {
    threads: usize,
    shared: bool,
    state: Mutex<SchedulerState>,
}

impl ThreadScheduler {
    /// Modules run at the same time and split `threads` (at least one each), evenly at first.
    pub fn shared(threads: usize) -> ThreadScheduler {
        let threads = threads.max(2);
        let rollout = threads.div_ceil(2);
        ThreadScheduler::with_allotment(
            threads,
            true,
            Allotment {
                rollout,
                trainer: threads - rollout,
            },
        )
    }

    /// Modules take turns: each gets every thread.
    pub fn exclusive(threads: usize) -> ThreadScheduler {
        let threads = threads.max(1);
        ThreadScheduler::with_allotment(
            threads,
            false,
            Allotment {
                rollout: threads,
                trainer: threads,
            },
        )
    }

    fn with_allotment(threads: usize, shared: bool, allotment: Allotment) -> ThreadScheduler {
        ThreadScheduler {
            threads,
            shared,
            state: Mutex::new(SchedulerState {
                allotment,
                pools: BTreeMap::new(),
            }),
        }
    }

    pub fn allotment(&self) -> Allotment {
        self.lock().allotment
    }

    /// Runs `work` on `module`'s current pool (every pool thread has flush-to-zero set, as
    /// `stoke_ops::numerics` requires for fast kernels).
    pub fn install<R: Send>(
        &self,
        module: ComputeModule,
        work: impl FnOnce() -> R + Send,
    ) -> Result<R, PipelineError> {
        let pool = {
            let mut state = self.lock();
            let size = state.allotment.of(module);
            match state.pools.get(&(module, size)) {
                Some(pool) => Arc::clone(pool),
                None => {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(size)
                        .thread_name(move |i| format!("stoke-{}-{i}", module.name()))
                        .start_handler(|_| stoke_ops::numerics::set_ftz_daz_on_this_thread())
                        .build()
                        .map_err(|e| PipelineError::ModuleStopped {
                            module: module.name(),
                            reason: format!("could not start a pool of {size} threads: {e}"),
                        })?;
                    let pool = Arc::new(pool);
                    state.pools.insert((module, size), Arc::clone(&pool));
                    pool
                }
            }
        };
        Ok(pool.install(work))
    }

    /// Re-splits the threads in proportion to each module's busy seconds over the last update
    /// (shared mode only; exclusive mode keeps every module at all threads). Returns the new
    /// allotment.
    pub fn rebalance(&self, rollout_busy: f64, trainer_busy: f64) -> Allotment {
        let mut state = self.lock();
        if !self.shared {
            return state.allotment;
        }
        let total = rollout_busy.max(0.0) + trainer_busy.max(0.0);
        if total > 0.0 && total.is_finite() {
            let share = rollout_busy.max(0.0) / total;
            let rollout =
                ((self.threads as f64 * share).round() as usize).clamp(1, self.threads - 1);
            state.allotment = Allotment {
                rollout,
                trainer: self.threads - rollout,
            };
        }
        state.allotment
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SchedulerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_split_follows_busy_time_and_keeps_one_each() {
        let scheduler = ThreadScheduler::shared(8);
        assert_eq!(
            scheduler.allotment(),
            Allotment {
                rollout: 4,
                trainer: 4
            }
        );
        let a = scheduler.rebalance(3.0, 1.0);
        assert_eq!(
            a,
            Allotment {
                rollout: 6,
                trainer: 2
            }
        );
        let a = scheduler.rebalance(100.0, 0.0);
        assert_eq!(
            a,
            Allotment {
                rollout: 7,
                trainer: 1
            }
        );
        let a = scheduler.rebalance(0.0, 0.0);
        assert_eq!(
            a,
            Allotment {
                rollout: 7,
                trainer: 1
            },
            "no measurement keeps the split"
        );
    }

    #[test]
    fn two_threads_stay_one_each_and_exclusive_gives_all() {
        let shared = ThreadScheduler::shared(2);
        assert_eq!(
            shared.rebalance(9.0, 1.0),
            Allotment {
                rollout: 1,
                trainer: 1
            }
        );
        let exclusive = ThreadScheduler::exclusive(4);
        assert_eq!(
            exclusive.rebalance(9.0, 1.0),
            Allotment {
                rollout: 4,
                trainer: 4
            }
        );
    }

    #[test]
    fn install_runs_on_a_pool_of_the_allotted_size() {
        let scheduler = ThreadScheduler::shared(6);
        scheduler.rebalance(2.0, 1.0);
        let rollout_threads = scheduler
            .install(ComputeModule::Rollout, rayon::current_num_threads)
            .unwrap();
        let trainer_threads = scheduler
            .install(ComputeModule::Trainer, rayon::current_num_threads)
            .unwrap();
        assert_eq!((rollout_threads, trainer_threads), (4, 2));
    }
}
