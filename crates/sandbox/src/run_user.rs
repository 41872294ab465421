//! Per-run uids for a root caller: each running program gets a uid (and gid) of its own,
//! `uid_base + slot`, held for the run and released afterwards.
//!
//! Why one uid per run and not `nobody` for all: `RLIMIT_NPROC` counts every process of a uid,
//! so a shared uid would let one run's fork bomb starve the others; and a uid of its own means a
//! program cannot signal or read another run's files even without namespaces.
//!
//! Each process uses its own block of uids, `uid_base + (pid mod 65536) * 4096`, so that two
//! processes sandboxing at once (a trainer and an evaluator, or two test binaries) do not share
//! uids: a shared uid would share the `RLIMIT_NPROC` count, and one process's fork bomb would
//! make the other's runs fail to start (`setuid` then `execve` fails with `EAGAIN`; seen as a
//! flaky test before this scheme).
//!
//! Invariant: within this process, a slot is held by at most one run at a time (a global
//! allocator, shared by every `Sandbox` in the process). Processes whose pids agree modulo 65536
//! and that run at the same time would still share a block.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

static HELD_SLOTS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Uids per process block (and so the most runs one process holds at once with distinct uids).
pub(crate) const SLOTS_PER_PROCESS: u32 = 4096;
/// Number of process blocks above `uid_base`.
pub(crate) const PROCESS_BLOCKS: u32 = 65536;

/// A held uid; released on drop.
#[derive(Debug)]
pub(crate) struct RunUser {
    slot: u32,
    uid: u32,
}

impl RunUser {
    /// Takes the lowest free slot of this process's block above `uid_base`.
    pub(crate) fn acquire(uid_base: u32) -> RunUser {
        let mut held = HELD_SLOTS.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = (0..).find(|slot| !held.contains(slot)).unwrap_or(0);
        held.insert(slot);
        let block = std::process::id() % PROCESS_BLOCKS;
        RunUser {
            slot,
            uid: uid_base
                .saturating_add(block * SLOTS_PER_PROCESS)
                .saturating_add(slot % SLOTS_PER_PROCESS),
        }
    }

    /// The uid, also used as the gid.
    pub(crate) fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for RunUser {
    fn drop(&mut self) {
        HELD_SLOTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_holders_get_distinct_uids_and_slots_are_reused() {
        let first = RunUser::acquire(1_000_000);
        let second = RunUser::acquire(1_000_000);
        assert_ne!(first.uid(), second.uid());
        let freed = first.uid();
        drop(first);
        let third = RunUser::acquire(1_000_000);
        assert_eq!(third.uid(), freed);
    }

    #[test]
    fn uids_lie_in_this_process_block() {
        let user = RunUser::acquire(1_000_000);
        let block_start = 1_000_000 + (std::process::id() % PROCESS_BLOCKS) * SLOTS_PER_PROCESS;
        assert!((block_start..block_start + SLOTS_PER_PROCESS).contains(&user.uid()));
    }
}
