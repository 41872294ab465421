//! The judge's verdict cache: a bounded map from a request's content to the verdict the judge
//! gave, shared by every clone of a verifier (GRPO repeats prompts, and a completion can come
//! back identical, so a verdict already paid for is reused).
//!
//! The key is a hash of the mode, model, rubric, scale, prompt and the completions in the
//! order shown ([`key`]); the per-call nonce is not part of it. The cache holds at most
//! `capacity` entries and evicts the oldest inserted first; capacity 0 keeps nothing. Only
//! verdicts are stored: failures (no answer, an unparseable verdict) are asked again.
//!
//! What this is not: a cache of HTTP answers or of anything across runs.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// The cache key of a request made of `parts` (each length-prefixed, so parts cannot run
/// into each other).
pub fn key(parts: &[&str]) -> u64 {
    let mut hasher = DefaultHasher::new();
    for part in parts {
        part.len().hash(&mut hasher);
        hasher.write(part.as_bytes());
    }
    hasher.finish()
}

/// A bounded, oldest-first-evicting map (module doc).
#[derive(Debug)]
pub struct VerdictCache<V> {
    capacity: usize,
    inner: Mutex<Entries<V>>,
}

#[derive(Debug)]
struct Entries<V> {
    map: HashMap<u64, V>,
    order: VecDeque<u64>,
}

impl<V: Clone> VerdictCache<V> {
    pub fn new(capacity: usize) -> Self {
        VerdictCache {
            capacity,
            inner: Mutex::new(Entries {
                map: HashMap::new(),
                order: VecDeque::new(),
            }),
        }
    }

    pub fn get(&self, key: u64) -> Option<V> {
        if self.capacity == 0 {
            return None;
        }
        let entries = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        entries.map.get(&key).cloned()
    }

    pub fn insert(&self, key: u64, value: V) {
        if self.capacity == 0 {
            return;
        }
        let mut entries = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if entries.map.insert(key, value).is_some() {
            return;
        }
        entries.order.push_back(key);
        while entries.order.len() > self.capacity {
            if let Some(oldest) = entries.order.pop_front() {
                entries.map.remove(&oldest);
            }
        }
    }

    pub fn len(&self) -> usize {
        let entries = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        entries.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_their_parts() {
        assert_ne!(key(&["ab", "c"]), key(&["a", "bc"]));
        assert_eq!(key(&["a", "b"]), key(&["a", "b"]));
        assert_ne!(
            key(&["a", "b"]),
            key(&["b", "a"]),
            "order is part of the key"
        );
    }

    #[test]
    fn the_oldest_entry_is_evicted_at_capacity() {
        let cache = VerdictCache::new(2);
        cache.insert(1, "one");
        cache.insert(2, "two");
        cache.insert(1, "one again");
        cache.insert(3, "three");
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(1), None, "the oldest inserted went first");
        assert_eq!(cache.get(2), Some("two"));
        assert_eq!(cache.get(3), Some("three"));
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let cache = VerdictCache::new(0);
        cache.insert(1, 1.0);
        assert_eq!(cache.get(1), None);
        assert!(cache.is_empty());
    }
}
