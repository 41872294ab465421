//! stoke's BPE trainer (the rustbpe design): parallel counting of pre-split pieces, then merges
//! on the unique pieces with `u64` counts, incremental pair-count updates and a lazy max-heap.
//!
//! Equivalence with the `tokenizers` crate's `BpeTrainer` (same merges, in the same order) rests
//! on reproducing its choices exactly:
//! - the pair count is the plain number of adjacent occurrences (`aaa` counts `(a, a)` twice);
//! - merging a word goes left to right over non-overlapping occurrences, and the count changes
//!   are the ones its `Word::merge` reports (the merged pair's own count is left stale);
//! - the heap orders by count, then by the smaller `(left, right)` pair in the reference's ids
//!   (specials, then the 256 ByteLevel characters sorted by code point, then merged tokens);
//! - a stale entry is refreshed and pushed back; a heap entry carries the set of words it was
//!   created for, and a merge touches only those words (as the reference does);
//! - a merge whose result string already exists reuses that id and does not grow the vocabulary;
//! - training stops when the vocabulary (specials included) reaches the target, or when the best
//!   count is below 1.
//!
//! Where it differs: counts are `i64`/`u64` where the reference uses `i32` (which overflows past
//! 2^31 occurrences of a pair, on corpora of tens of GB); merging inside a step is sequential.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use ahash::AHashMap;
use rayon::prelude::*;

use super::{TrainError, TrainedBpe, TrainerConfig};

/// Unique pre-split pieces and how often each occurs.
#[derive(Debug)]
pub struct WordCounts {
    splitter: Splitter,
    pub counts: AHashMap<String, u64>,
    /// Texts whose splitting failed (the regex engine's backtrack limit); their rest is skipped.
    pub split_errors: u64,
}

impl WordCounts {
    pub fn new(pattern: &str) -> Result<Self, TrainError> {
        let splitter = if pattern == super::CL100K_PATTERN {
            Splitter::Cl100k
        } else {
            Splitter::Regex(
                fancy_regex::Regex::new(pattern).map_err(|e| TrainError::Pattern(e.to_string()))?,
            )
        };
        Ok(WordCounts {
            splitter,
            counts: AHashMap::new(),
            split_errors: 0,
        })
    }

    /// Splits and counts a batch of texts in parallel (one rayon task per text).
    pub fn add_texts<S: AsRef<str> + Sync>(&mut self, texts: &[S]) {
        let splitter = &self.splitter;
        let (counts, errors) = texts
            .par_iter()
            .fold(
                || (AHashMap::<String, u64>::new(), 0u64),
                |(mut counts, mut errors), text| {
                    match splitter {
                        Splitter::Cl100k => {
                            for piece in super::split::cl100k_pieces(text.as_ref()) {
                                bump(&mut counts, piece, 1);
                            }
                        }
                        Splitter::Regex(regex) => {
                            for piece in regex.find_iter(text.as_ref()) {
                                match piece {
                                    Ok(m) => bump(&mut counts, m.as_str(), 1),
                                    Err(_) => {
                                        errors += 1;
                                        break;
                                    }
                                }
                            }
                        }
                    }
                    (counts, errors)
                },
            )
            .reduce(|| (AHashMap::new(), 0), merge_counts);
        self.split_errors += errors;
        if self.counts.is_empty() {
            self.counts = counts;
        } else {
            for (word, n) in counts {
                *self.counts.entry(word).or_default() += n;
            }
        }
    }

    /// Total number of pieces counted.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// How texts are pre-split: the hand-written cl100k splitter, or any other pattern through
/// `fancy-regex`.
#[derive(Debug)]
enum Splitter {
    Cl100k,
    Regex(fancy_regex::Regex),
}

fn bump(counts: &mut AHashMap<String, u64>, word: &str, n: u64) {
    match counts.get_mut(word) {
        Some(c) => *c += n,
        None => {
            counts.insert(word.to_owned(), n);
        }
    }
}

fn merge_counts(
    (mut a, ea): (AHashMap<String, u64>, u64),
    (b, eb): (AHashMap<String, u64>, u64),
) -> (AHashMap<String, u64>, u64) {
    let (mut big, small) = if a.len() >= b.len() {
        (std::mem::take(&mut a), b)
    } else {
        (b, a)
    };
    for (word, n) in small {
        *big.entry(word).or_default() += n;
    }
    (big, ea + eb)
}

type Pair = (u32, u32);

/// A heap entry: a pair, its count when pushed, and the words it was created for.
struct Candidate {
    count: u64,
    /// The pair in the reference trainer's id order, for tie-breaking.
    order_key: Pair,
    pair: Pair,
    words: Vec<u32>,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: higher count first, then the smaller pair.
        self.count
            .cmp(&other.count)
            .then_with(|| other.order_key.cmp(&self.order_key))
    }
}

/// Progress of the merge phase, for a progress bar.
#[derive(Clone, Copy, Debug)]
pub struct TrainProgress {
    pub merges_done: usize,
    pub merges_target: usize,
}

/// Learns merges from counted pieces. `on_progress` is called after every merge.
pub fn train_bpe(
    words: &WordCounts,
    config: &TrainerConfig,
    mut on_progress: impl FnMut(TrainProgress),
) -> Result<TrainedBpe, TrainError> {
    config.validate()?;
    let specials = config.special_tokens.len();
    let target_tokens = config.vocab_size - specials; // bytes + merged tokens

    // Unique words in a deterministic order (the map's order is random per process).
    let mut entries: Vec<(&String, u64)> = words.counts.iter().map(|(w, &c)| (w, c)).collect();
    entries.sort_unstable();
    let mut symbols: Vec<Vec<u32>> = entries
        .iter()
        .map(|(w, _)| w.bytes().map(u32::from).collect())
        .collect();
    let counts: Vec<u64> = entries.iter().map(|&(_, c)| c).collect();
    drop(entries);

    let mut vocab: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let mut vocab_ids: AHashMap<Vec<u8>, u32> = vocab
        .iter()
        .enumerate()
        .map(|(i, b)| (b.clone(), i as u32))
        .collect();
    let byte_order = byte_order_keys();
    let key = |id: u32| {
        if id < 256 {
            byte_order[id as usize]
        } else {
            id
        }
    };

    let (mut pair_counts, initial) = count_pairs(&symbols, &counts);
    let mut heap: BinaryHeap<Candidate> = initial
        .into_iter()
        .filter_map(|(pair, words)| {
            let count = *pair_counts.get(&pair)?;
            (count > 0).then(|| Candidate {
                count: count as u64,
                order_key: (key(pair.0), key(pair.1)),
                pair,
                words,
            })
        })
        .collect();

    let merges_target = target_tokens.saturating_sub(256);
    let mut merges: Vec<(Pair, u32)> = Vec::with_capacity(merges_target);
    let mut changes: Vec<(Pair, i64)> = Vec::new();
    let mut scratch: Vec<u32> = Vec::new();
    while vocab.len() < target_tokens {
        let Some(mut top) = heap.pop() else { break };
        let current = pair_counts.get(&top.pair).copied().unwrap_or(0);
        if top.count as i64 != current {
            top.count = current.max(0) as u64;
            heap.push(top);
            continue;
        }
        if top.count < 1 {
            break;
        }
        let (a, b) = top.pair;
        let mut joined = vocab[a as usize].clone();
        joined.extend_from_slice(&vocab[b as usize]);
        let new_id = match vocab_ids.get(&joined) {
            Some(&id) => id,
            None => {
                let id = vocab.len() as u32;
                vocab_ids.insert(joined.clone(), id);
                vocab.push(joined);
                id
            }
        };
        merges.push((top.pair, new_id));

        let mut touched: AHashMap<Pair, Vec<u32>> = AHashMap::new();
        for &w in &top.words {
            changes.clear();
            merge_word(
                &mut symbols[w as usize],
                a,
                b,
                new_id,
                &mut changes,
                &mut scratch,
            );
            let n = counts[w as usize] as i64;
            for &(pair, delta) in &changes {
                *pair_counts.entry(pair).or_default() += delta * n;
                if delta > 0 {
                    let list = touched.entry(pair).or_default();
                    if list.last() != Some(&w) {
                        list.push(w);
                    }
                }
            }
        }
        for (pair, words) in touched {
            let count = pair_counts.get(&pair).copied().unwrap_or(0);
            if count > 0 {
                heap.push(Candidate {
                    count: count as u64,
                    order_key: (key(pair.0), key(pair.1)),
                    pair,
                    words,
                });
            }
        }
        on_progress(TrainProgress {
            merges_done: merges.len(),
            merges_target,
        });
    }
    Ok(TrainedBpe {
        vocab,
        merges,
        special_tokens: config.special_tokens.clone(),
        pattern: config.pattern.clone(),
    })
}

/// For each byte, its rank among the 256 ByteLevel characters sorted by code point: the order
/// in which the reference trainer numbers its alphabet.
fn byte_order_keys() -> [u32; 256] {
    let table = super::export::byte_to_char();
    let mut bytes: Vec<u8> = (0..=255u8).collect();
    bytes.sort_by_key(|&b| table[b as usize]);
    let mut keys = [0u32; 256];
    for (rank, &b) in bytes.iter().enumerate() {
        keys[b as usize] = rank as u32;
    }
    keys
}

/// Initial pair counts and, per pair, the words containing it (ascending, no duplicates).
fn count_pairs(
    symbols: &[Vec<u32>],
    counts: &[u64],
) -> (AHashMap<Pair, i64>, AHashMap<Pair, Vec<u32>>) {
    const CHUNK: usize = 4096;
    let (pair_counts, mut where_) = symbols
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(chunk, words)| {
            let mut pair_counts: AHashMap<Pair, i64> = AHashMap::new();
            let mut where_: AHashMap<Pair, Vec<u32>> = AHashMap::new();
            for (offset, word) in words.iter().enumerate() {
                let w = (chunk * CHUNK + offset) as u32;
                for pair in word.windows(2) {
                    let pair = (pair[0], pair[1]);
                    *pair_counts.entry(pair).or_default() += counts[w as usize] as i64;
                    let list = where_.entry(pair).or_default();
                    if list.last() != Some(&w) {
                        list.push(w);
                    }
                }
            }
            (pair_counts, where_)
        })
        .reduce(
            || (AHashMap::new(), AHashMap::new()),
            |(mut pc, mut wh), (pc2, wh2)| {
                for (pair, n) in pc2 {
                    *pc.entry(pair).or_default() += n;
                }
                for (pair, list) in wh2 {
                    let entry = wh.entry(pair).or_default();
                    entry.extend(list);
                }
                (pc, wh)
            },
        );
    // Chunks may be reduced out of order; sorted lists keep the merge order fixed.
    for list in where_.values_mut() {
        list.sort_unstable();
    }
    (pair_counts, where_)
}

/// Replaces every non-overlapping `(a, b)` (left to right) with `new_id`, reporting pair-count
/// changes exactly as the reference trainer's `Word::merge` does.
fn merge_word(
    word: &mut Vec<u32>,
    a: u32,
    b: u32,
    new_id: u32,
    changes: &mut Vec<(Pair, i64)>,
    out: &mut Vec<u32>,
) {
    out.clear();
    let n = word.len();
    let mut i = 0;
    while i < n {
        if word[i] == a && i + 1 < n && word[i + 1] == b {
            if let Some(&prev) = out.last() {
                changes.push(((prev, a), -1));
                changes.push(((prev, new_id), 1));
            }
            out.push(new_id);
            if i + 2 < n {
                let next = word[i + 2];
                changes.push(((b, next), -1));
                changes.push(((new_id, next), 1));
            }
            i += 2;
        } else {
            out.push(word[i]);
            i += 1;
        }
    }
    std::mem::swap(word, out);
}
