//! Per-run uids for a root caller: each running program gets a uid (and gid) of its own,
//! `uid_base + slot`, held for the run and released afterwards.
//!
//! Why one uid per run and not `nobody` for all: `RLIMIT_NPROC` counts every process of a uid,
//! so a shared uid would let one run's fork bomb starve the others; and a uid of its own means a
//! program cannot signal or read another run's files even without namespaces.
//!
//! Invariant: within this process, a slot is held by at most one run at a time (a global
//! allocator, shared by every `Sandbox` in the process). Two *processes* using the same
//! `uid_base` could collide; the PID namespace still keeps their processes apart.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

static HELD_SLOTS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// A held uid; released on drop.
#[derive(Debug)]
pub(crate) struct RunUser {
    slot: u32,
    uid: u32,
}

impl RunUser {
    /// Takes the lowest free slot above `uid_base`.
    pub(crate) fn acquire(uid_base: u32) -> RunUser {
        let mut held = HELD_SLOTS.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = (0..).find(|slot| !held.contains(slot)).unwrap_or(0);
        held.insert(slot);
        RunUser {
            slot,
            uid: uid_base.saturating_add(slot),
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
}
