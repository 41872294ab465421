//! A bounded multi-producer multi-consumer buffer of typed records: the queue between two RL
//! modules (rollout -> reward -> trainer).
//!
//! Invariants:
//! - capacity is counted in records and in bytes ([`SizeInBytes`]); neither limit is ever
//!   exceeded. A send that would exceed one blocks (back-pressure) until consumers make room; a
//!   record larger than the byte limit on its own is refused at once, since it could never fit.
//! - pops come in priority order: smallest [`Prioritized::priority_key`] first (for RL samples,
//!   the oldest update slot / policy version), first-in first-out among equal keys.
//! - close: after [`RecordBuffer::close`] every blocked or later send fails and hands its record
//!   back; receivers drain what is left and then get `None`. Closing wakes every blocked caller.
//!
//! What it is not: not async (std threads and a condition variable; a tokio front can wrap it),
//! not persistent, and it does not look inside records beyond their size and key.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The default byte capacity of a buffer between modules: 16 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// How much memory a record holds, for the byte limit; an estimate of owned heap plus inline size.
pub trait SizeInBytes {
    fn size_in_bytes(&self) -> u64;
}

/// The pop order of a record: smaller keys leave first.
pub trait Prioritized {
    fn priority_key(&self) -> u64;
}

/// Validated buffer limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferCapacity {
    max_records: usize,
    max_bytes: u64,
}

impl BufferCapacity {
    pub fn new(max_records: usize, max_bytes: u64) -> Result<Self, BufferError> {
        if max_records == 0 {
            return Err(BufferError::ZeroCapacity {
                field: "max_records",
            });
        }
        if max_bytes == 0 {
            return Err(BufferError::ZeroCapacity { field: "max_bytes" });
        }
        Ok(BufferCapacity {
            max_records,
            max_bytes,
        })
    }

    /// `max_records` records within the default 16 MiB.
    pub fn with_default_bytes(max_records: usize) -> Result<Self, BufferError> {
        Self::new(max_records, DEFAULT_MAX_BYTES)
    }

    pub fn max_records(&self) -> usize {
        self.max_records
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BufferError {
    #[error("buffer capacity field `{field}` must be at least 1")]
    ZeroCapacity { field: &'static str },
}

/// Why a send did not happen; the record comes back to the caller.
#[derive(Debug, thiserror::Error)]
pub enum SendError<T> {
    #[error("the buffer is closed")]
    Closed(T),
    #[error("a record of {size} bytes can never fit a buffer of {max_bytes} bytes")]
    RecordTooLarge {
        record: T,
        size: u64,
        max_bytes: u64,
    },
}

/// Monitoring counters, read with [`RecordBuffer::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferStats {
    pub records: usize,
    pub bytes: u64,
    pub max_records_seen: usize,
    pub max_bytes_seen: u64,
    pub sent: u64,
    pub received: u64,
    /// Total time senders spent waiting for room (back-pressure on the producer).
    pub send_blocked: Duration,
    /// Total time receivers spent waiting for a record (starvation of the consumer).
    pub receive_blocked: Duration,
    /// Senders waiting for room right now.
    pub waiting_senders: usize,
    /// Receivers waiting for a record right now.
    pub waiting_receivers: usize,
}

struct Entry<T> {
    key: u64,
    sequence: u64,
    size: u64,
    record: T,
}

// BinaryHeap is a max-heap: the "greatest" entry is the smallest key, then the oldest sequence.
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .key
            .cmp(&self.key)
            .then(other.sequence.cmp(&self.sequence))
    }
}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<T> Eq for Entry<T> {}

struct State<T> {
    heap: BinaryHeap<Entry<T>>,
    next_sequence: u64,
    closed: bool,
    stats: BufferStats,
}

/// The buffer; share it between threads behind an `Arc`.
pub struct RecordBuffer<T> {
    capacity: BufferCapacity,
    state: Mutex<State<T>>,
    /// Signalled when a record leaves or the buffer closes (senders wait on it).
    room: Condvar,
    /// Signalled when a record arrives or the buffer closes (receivers wait on it).
    arrival: Condvar,
}

impl<T: SizeInBytes + Prioritized> RecordBuffer<T> {
    pub fn new(capacity: BufferCapacity) -> Self {
        RecordBuffer {
            capacity,
            state: Mutex::new(State {
                heap: BinaryHeap::new(),
                next_sequence: 0,
                closed: false,
                stats: BufferStats::default(),
            }),
            room: Condvar::new(),
            arrival: Condvar::new(),
        }
    }

    pub fn capacity(&self) -> BufferCapacity {
        self.capacity
    }

    // Every mutation under the lock keeps the heap and its counters consistent before any call
    // that could panic, so a poisoned lock is recovered rather than propagated.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fits(&self, state: &State<T>, size: u64) -> bool {
        state.stats.records < self.capacity.max_records
            && state.stats.bytes + size <= self.capacity.max_bytes
    }

    /// Adds a record, blocking while the buffer is full.
    pub fn send(&self, record: T) -> Result<(), SendError<T>> {
        let size = record.size_in_bytes();
        if size > self.capacity.max_bytes {
            return Err(SendError::RecordTooLarge {
                record,
                size,
                max_bytes: self.capacity.max_bytes,
            });
        }
        let mut state = self.lock();
        let started = Instant::now();
        let mut waited = false;
        while !state.closed && !self.fits(&state, size) {
            waited = true;
            state.stats.waiting_senders += 1;
            state = self
                .room
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.stats.waiting_senders -= 1;
        }
        if waited {
            state.stats.send_blocked += started.elapsed();
        }
        if state.closed {
            return Err(SendError::Closed(record));
        }
        let sequence = state.next_sequence;
        state.next_sequence += 1;
        state.heap.push(Entry {
            key: record.priority_key(),
            sequence,
            size,
            record,
        });
        let stats = &mut state.stats;
        stats.records += 1;
        stats.bytes += size;
        stats.sent += 1;
        stats.max_records_seen = stats.max_records_seen.max(stats.records);
        stats.max_bytes_seen = stats.max_bytes_seen.max(stats.bytes);
        drop(state);
        // Receivers may wait for different key bounds, so wake them all.
        self.arrival.notify_all();
        Ok(())
    }

    /// Takes the record with the smallest key, blocking while the buffer is empty; `None` once
    /// the buffer is closed and drained.
    pub fn pop(&self) -> Option<T> {
        self.pop_at_most(u64::MAX)
    }

    /// Takes the record with the smallest key if that key is `<= max_key`, blocking until one
    /// is there; `None` once the buffer is closed and holds no such record. The trainer uses
    /// this to take exactly the samples of its update slot.
    pub fn pop_at_most(&self, max_key: u64) -> Option<T> {
        let mut state = self.lock();
        let started = Instant::now();
        let mut waited = false;
        loop {
            if state.heap.peek().is_some_and(|top| top.key <= max_key) {
                break;
            }
            if state.closed {
                if waited {
                    state.stats.receive_blocked += started.elapsed();
                }
                return None;
            }
            waited = true;
            state.stats.waiting_receivers += 1;
            state = self
                .arrival
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.stats.waiting_receivers -= 1;
        }
        if waited {
            state.stats.receive_blocked += started.elapsed();
        }
        let entry = state.heap.pop()?;
        state.stats.records -= 1;
        state.stats.bytes -= entry.size;
        state.stats.received += 1;
        drop(state);
        self.room.notify_all();
        Some(entry.record)
    }

    /// Takes the smallest-key record if there is one, without blocking.
    pub fn try_pop(&self) -> Option<T> {
        let mut state = self.lock();
        let entry = state.heap.pop()?;
        state.stats.records -= 1;
        state.stats.bytes -= entry.size;
        state.stats.received += 1;
        drop(state);
        self.room.notify_all();
        Some(entry.record)
    }

    /// Refuses further sends and wakes every blocked sender and receiver.
    pub fn close(&self) {
        self.lock().closed = true;
        self.room.notify_all();
        self.arrival.notify_all();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    pub fn stats(&self) -> BufferStats {
        self.lock().stats
    }
}
