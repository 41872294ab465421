//! Threads that stay alive between decode steps: `run(threads, job)` calls `job(0)` on the
//! calling thread and `job(1..threads)` on helpers, and returns when all have returned.
//!
//! Why: a batch-1 decode step of a 135M model takes a few milliseconds, and spawning its helper
//! thread every step cost a large share of that. Measured on a 2-vCPU Zen 4 VM, a sweep over
//! SmolLM2-135M's bf16 weights in the decode step's phases: 32-34 GB/s with threads that live
//! across steps, 28 with a thread spawned per step (the new thread's stack, and waking an idle
//! virtual CPU). Helpers spin for a short while after a job (the next step comes after a few
//! microseconds of sampling), then park until the next one.
//!
//! What it is not: a general pool. One set of helpers serves one step at a time; a step that
//! finds them busy (decoding on two threads of the caller at once) or wanting another thread
//! count spawns scoped threads as before. Results never depend on which threads ran a job.
#![allow(unsafe_code)]

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before it parks.
const SPIN: Duration = Duration::from_millis(2);

type Job<'a> = dyn Fn(usize) + Sync + 'a;

/// What the caller and its helpers share.
struct Shared {
    /// Bumped once per job; a helper runs the job when it sees a new value.
    epoch: AtomicUsize,
    /// The current job, valid while `pending > 0` (see `run`).
    job: Mutex<Option<&'static Job<'static>>>,
    /// Helpers that have not finished the current job.
    pending: AtomicUsize,
    /// The first panic of a helper's job, for the caller to resume.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    shutdown: AtomicBool,
}

struct Helper {
    handle: JoinHandle<()>,
    /// The helper is parked or about to park: unpark it for the next job.
    sleeping: Arc<AtomicBool>,
}

struct Helpers {
    shared: Arc<Shared>,
    helpers: Vec<Helper>,
}

static HELPERS: Mutex<Option<Helpers>> = Mutex::new(None);

impl Helpers {
    fn new(count: usize) -> std::io::Result<Helpers> {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: Mutex::new(None),
            pending: AtomicUsize::new(0),
            panic: Mutex::new(None),
            shutdown: AtomicBool::new(false),
        });
        // Built up in place, so a failed spawn drops (shuts down and joins) those made so far.
        let mut made = Helpers {
            shared,
            helpers: Vec::with_capacity(count),
        };
        for index in 1..=count {
            let sleeping = Arc::new(AtomicBool::new(false));
            let (s, z) = (Arc::clone(&made.shared), Arc::clone(&sleeping));
            let handle = std::thread::Builder::new()
                .name(format!("stoke-step-{index}"))
                .spawn(move || helper_loop(&s, &z, index))?;
            made.helpers.push(Helper { handle, sleeping });
        }
        Ok(made)
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for helper in std::mem::take(&mut self.helpers) {
            helper.handle.thread().unpark();
            let _ = helper.handle.join();
        }
    }
}

fn helper_loop(shared: &Shared, sleeping: &AtomicBool, index: usize) {
    crate::numerics::set_ftz_daz_on_this_thread();
    let mut seen = 0;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        let epoch = loop {
            let epoch = shared.epoch.load(Ordering::SeqCst);
            if epoch != seen {
                break epoch;
            }
            if shared.shutdown.load(Ordering::SeqCst) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(1024) || start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            // Park; the caller unparks a sleeping helper after it bumps the epoch. Setting the
            // flag before the second look at the epoch (both SeqCst) means either this look
            // sees the new job or the caller sees the flag.
            sleeping.store(true, Ordering::SeqCst);
            if shared.epoch.load(Ordering::SeqCst) == seen
                && !shared.shutdown.load(Ordering::SeqCst)
            {
                std::thread::park();
            }
            sleeping.store(false, Ordering::SeqCst);
        };
        seen = epoch;
        let job = *shared.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job
            && let Err(payload) = catch_unwind(AssertUnwindSafe(|| job(index)))
        {
            // Kept for the caller (moved, not dropped here: dropping a payload can panic).
            let mut slot = shared.panic.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(payload);
            } else {
                std::mem::forget(payload);
            }
        }
        shared.pending.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits for every helper to finish the current job, also when the caller's own part panics
/// (the job borrows the caller's stack).
struct WaitForHelpers<'a>(&'a Shared);

impl Drop for WaitForHelpers<'_> {
    fn drop(&mut self) {
        let mut spins = 0u32;
        while self.0.pending.load(Ordering::SeqCst) != 0 {
            spins = spins.wrapping_add(1);
            if spins < 100_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *self.0.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Calls `job(t)` for every `t < threads`, `job(0)` on this thread, and returns when all calls
/// have returned. A helper's panic is resumed on this thread. (A job whose threads meet at a
/// barrier still hangs if one of them panics before it, as under `std::thread::scope`.)
pub(crate) fn run(threads: usize, job: &Job<'_>) {
    if threads <= 1 {
        job(0);
        return;
    }
    // Busy (another thread is decoding): scoped threads, as a fallback. A poisoned lock (a
    // caller's own part panicked) still holds working helpers: each job waits for all of them.
    let mut guard = match HELPERS.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => return run_scoped(threads, job),
    };
    if guard.as_ref().map(|h| h.helpers.len()) != Some(threads - 1) {
        *guard = None;
        match Helpers::new(threads - 1) {
            Ok(helpers) => *guard = Some(helpers),
            Err(_) => return run_scoped(threads, job),
        }
    }
    let Some(helpers) = guard.as_ref() else {
        return run_scoped(threads, job);
    };
    let shared = &*helpers.shared;
    // SAFETY: the job is only called while `pending > 0`, and `WaitForHelpers` (dropped before
    // this function returns or unwinds) waits until every helper has finished with it and
    // clears it; so the reference never outlives the borrow it was made from.
    let job_static: &'static Job<'static> =
        unsafe { std::mem::transmute::<&Job<'_>, &'static Job<'static>>(job) };
    *shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job_static);
    shared.pending.store(threads - 1, Ordering::SeqCst);
    shared.epoch.fetch_add(1, Ordering::SeqCst);
    for helper in &helpers.helpers {
        if helper.sleeping.load(Ordering::SeqCst) {
            helper.handle.thread().unpark();
        }
    }
    {
        let _wait = WaitForHelpers(shared);
        job(0);
    }
    let panic = shared
        .panic
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(payload) = panic {
        drop(guard);
        resume_unwind(payload);
    }
}

fn run_scoped(threads: usize, job: &Job<'_>) {
    std::thread::scope(|scope| {
        for thread in 1..threads {
            scope.spawn(move || {
                crate::numerics::set_ftz_daz_on_this_thread();
                job(thread)
            });
        }
        job(0);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once_per_call_on_threads_that_persist() {
        for threads in [1, 2, 3, 2] {
            for _ in 0..50 {
                let counts: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
                run(threads, &|t| {
                    counts[t].fetch_add(1, Ordering::SeqCst);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::SeqCst) == 1));
            }
        }
        // After the helpers parked, a job still reaches them.
        std::thread::sleep(SPIN * 3);
        let sum = AtomicUsize::new(0);
        run(2, &|t| {
            sum.fetch_add(t + 1, Ordering::SeqCst);
        });
        assert_eq!(sum.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_helper_s_panic_reaches_the_caller_and_the_helpers_keep_working() {
        let caught = catch_unwind(|| {
            run(2, &|t| {
                if t == 1 {
                    panic!("helper fails");
                }
            })
        });
        let payload = caught.expect_err("the helper's panic reaches the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"helper fails"));
        let ran = AtomicUsize::new(0);
        run(2, &|_| {
            ran.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn calls_from_two_threads_at_once_both_complete() {
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..200 {
                        let ran = AtomicUsize::new(0);
                        run(2, &|_| {
                            ran.fetch_add(1, Ordering::SeqCst);
                        });
                        assert_eq!(ran.load(Ordering::SeqCst), 2);
                    }
                });
            }
        });
    }
}
