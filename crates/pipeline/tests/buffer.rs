//! The bounded buffer: capacity in records and bytes under concurrent load, priority order,
//! close semantics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stoke_pipeline::{BufferCapacity, Prioritized, RecordBuffer, SendError, SizeInBytes};

#[derive(Debug, PartialEq, Eq)]
struct Record {
    key: u64,
    id: u64,
    bytes: u64,
}

impl SizeInBytes for Record {
    fn size_in_bytes(&self) -> u64 {
        self.bytes
    }
}

impl Prioritized for Record {
    fn priority_key(&self) -> u64 {
        self.key
    }
}

/// Waits (up to 10 s) until `done` holds: a thread is observed blocked, not merely assumed to be.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

fn capacity(records: usize, bytes: u64) -> BufferCapacity {
    BufferCapacity::new(records, bytes).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn zero_capacity_is_refused_naming_the_field() {
    let error = BufferCapacity::new(0, 10)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("max_records"), "{error}");
    let error = BufferCapacity::new(3, 0)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("max_bytes"), "{error}");
}

#[test]
fn capacity_in_records_and_bytes_is_never_exceeded_under_load() {
    const PRODUCERS: u64 = 3;
    const CONSUMERS: u64 = 2;
    const PER_PRODUCER: u64 = 150;
    let buffer = Arc::new(RecordBuffer::<Record>::new(capacity(5, 120)));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let buffer = Arc::clone(&buffer);
            thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(p);
                for id in 0..PER_PRODUCER {
                    let record = Record {
                        key: rng.random_range(0..4),
                        id,
                        bytes: rng.random_range(1..=60),
                    };
                    if rng.random_bool(0.2) {
                        thread::sleep(Duration::from_micros(rng.random_range(0..=1000)));
                    }
                    assert!(buffer.send(record).is_ok());
                }
            })
        })
        .collect();
    // Consumers start only once a producer is seen blocked, so back-pressure is certain.
    wait_until("a producer blocks", || buffer.stats().waiting_senders >= 1);
    let received = Arc::new(AtomicU64::new(0));
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|c| {
            let buffer = Arc::clone(&buffer);
            let received = Arc::clone(&received);
            thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(100 + c);
                while buffer.pop().is_some() {
                    received.fetch_add(1, Ordering::Relaxed);
                    if rng.random_bool(0.2) {
                        thread::sleep(Duration::from_micros(rng.random_range(0..=1000)));
                    }
                }
            })
        })
        .collect();
    for producer in producers {
        producer
            .join()
            .unwrap_or_else(|_| panic!("producer panicked"));
    }
    buffer.close();
    for consumer in consumers {
        consumer
            .join()
            .unwrap_or_else(|_| panic!("consumer panicked"));
    }
    let stats = buffer.stats();
    assert_eq!(received.load(Ordering::Relaxed), PRODUCERS * PER_PRODUCER);
    assert_eq!(stats.sent, PRODUCERS * PER_PRODUCER);
    assert!(stats.max_records_seen <= 5, "{stats:?}");
    assert!(stats.max_bytes_seen <= 120, "{stats:?}");
    assert!(
        stats.send_blocked > Duration::ZERO,
        "the load never exercised back-pressure"
    );
    assert_eq!((stats.records, stats.bytes), (0, 0));
}

#[test]
fn pops_smallest_key_first_and_fifo_among_equal_keys() {
    let buffer = RecordBuffer::<Record>::new(capacity(10, 1000));
    for (id, key) in [(0, 3), (1, 1), (2, 2), (3, 1), (4, 0), (5, 2)] {
        assert!(buffer.send(Record { key, id, bytes: 1 }).is_ok());
    }
    let order: Vec<u64> = std::iter::from_fn(|| buffer.try_pop())
        .map(|r| r.id)
        .collect();
    assert_eq!(order, vec![4, 1, 3, 2, 5, 0]);
}

#[test]
fn pop_at_most_waits_for_a_key_within_the_bound() {
    let buffer = Arc::new(RecordBuffer::<Record>::new(capacity(10, 1000)));
    assert!(
        buffer
            .send(Record {
                key: 5,
                id: 0,
                bytes: 1
            })
            .is_ok()
    );
    let waiting = {
        let buffer = Arc::clone(&buffer);
        thread::spawn(move || buffer.pop_at_most(2))
    };
    wait_until("the receiver waits", || {
        buffer.stats().waiting_receivers == 1
    });
    assert!(
        !waiting.is_finished(),
        "a key-5 record must not satisfy pop_at_most(2)"
    );
    assert!(
        buffer
            .send(Record {
                key: 2,
                id: 1,
                bytes: 1
            })
            .is_ok()
    );
    let got = waiting.join().unwrap_or_else(|_| panic!("pop panicked"));
    assert_eq!(got.map(|r| r.id), Some(1));
}

#[test]
fn an_oversized_record_is_refused_at_once() {
    let buffer = RecordBuffer::<Record>::new(capacity(10, 100));
    match buffer.send(Record {
        key: 0,
        id: 7,
        bytes: 101,
    }) {
        Err(SendError::RecordTooLarge {
            record,
            size,
            max_bytes,
        }) => {
            assert_eq!((record.id, size, max_bytes), (7, 101, 100));
        }
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }
}

#[test]
fn close_wakes_a_blocked_sender_and_returns_its_record() {
    let buffer = Arc::new(RecordBuffer::<Record>::new(capacity(1, 100)));
    assert!(
        buffer
            .send(Record {
                key: 0,
                id: 0,
                bytes: 1
            })
            .is_ok()
    );
    let blocked = {
        let buffer = Arc::clone(&buffer);
        thread::spawn(move || {
            buffer.send(Record {
                key: 0,
                id: 1,
                bytes: 1,
            })
        })
    };
    wait_until("the sender waits", || buffer.stats().waiting_senders == 1);
    thread::sleep(Duration::from_millis(10));
    assert!(
        !blocked.is_finished(),
        "the sender must block on a full buffer"
    );
    buffer.close();
    match blocked.join().unwrap_or_else(|_| panic!("send panicked")) {
        Err(SendError::Closed(record)) => assert_eq!(record.id, 1),
        other => panic!("expected Closed, got {other:?}"),
    }
    // What was buffered before the close is still drained, then receivers see the end.
    assert_eq!(buffer.pop().map(|r| r.id), Some(0));
    assert_eq!(buffer.pop(), None);
}

#[test]
fn close_wakes_a_blocked_receiver() {
    let buffer = Arc::new(RecordBuffer::<Record>::new(capacity(4, 100)));
    let blocked = {
        let buffer = Arc::clone(&buffer);
        thread::spawn(move || buffer.pop())
    };
    wait_until("the receiver waits", || {
        buffer.stats().waiting_receivers == 1
    });
    thread::sleep(Duration::from_millis(10));
    assert!(
        !blocked.is_finished(),
        "the receiver must block on an empty buffer"
    );
    buffer.close();
    assert_eq!(
        blocked.join().unwrap_or_else(|_| panic!("pop panicked")),
        None
    );
    assert!(buffer.stats().receive_blocked >= Duration::from_millis(10));
}

#[test]
fn byte_limit_blocks_even_with_record_slots_free() {
    let buffer = Arc::new(RecordBuffer::<Record>::new(capacity(10, 100)));
    assert!(
        buffer
            .send(Record {
                key: 0,
                id: 0,
                bytes: 80
            })
            .is_ok()
    );
    let blocked = {
        let buffer = Arc::clone(&buffer);
        thread::spawn(move || {
            buffer
                .send(Record {
                    key: 0,
                    id: 1,
                    bytes: 30,
                })
                .is_ok()
        })
    };
    wait_until("the sender waits", || buffer.stats().waiting_senders == 1);
    assert!(
        !blocked.is_finished(),
        "80 + 30 bytes must not fit a 100-byte buffer"
    );
    assert_eq!(buffer.pop().map(|r| r.id), Some(0));
    assert!(blocked.join().unwrap_or_else(|_| panic!("send panicked")));
    assert_eq!(buffer.stats().max_bytes_seen, 80);
    assert!(buffer.stats().send_blocked > Duration::ZERO);
    assert_eq!(buffer.stats().waiting_senders, 0);
}
