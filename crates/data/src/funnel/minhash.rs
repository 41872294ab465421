//! Near-duplicate removal with MinHash LSH (Broder 1997; the FineWeb/datatrove setting).
//!
//! Each document becomes the set of its word n-grams (default 5) after lowercasing and dropping
//! punctuation. A seeded family of `bands * rows` hash functions `h_i(x) = (a_i x + b_i) mod
//! (2^61 - 1)` gives the signature (the minimum of each over the set); two documents with Jaccard
//! similarity `s` agree on one signature entry with probability `s`, on a whole band of `rows`
//! entries with `s^rows`, and share at least one of `bands` bands (become candidates) with
//! `P(s) = 1 - (1 - s^rows)^bands`. The default 14 x 8 (112 hashes) puts the 50% point near
//! s = 0.72.
//!
//! Clustering (`clustering = "global"`, the default): band keys go into one table per band and
//! every document that shares a band key with another joins its cluster (union-find over the
//! whole corpus), so the clusters are the connected components of "shares a band", the same for
//! any reading order. Only when the input is exhausted is one document kept per cluster, its
//! earliest in reading order: the run spools the documents that reach this stage to disk
//! (`report_dir/minhash-spool.jsonl`) and sends them on afterwards
//! ([`MinHashDedup::observe`], [`MinHashDedup::finish_clusters`], [`MinHashDedup::is_kept`]).
//! Memory: the band tables and the union-find, about 470 MiB at a million documents and 14 bands
//! (measured by `cargo run --release -p stoke-data --example minhash_memory`).
//!
//! `clustering = "streaming"` decides as documents arrive, for inputs too large to spool: a
//! document that shares a band with an earlier one joins its cluster and is removed at once, so
//! two documents kept before a later one links them both stay kept (the clusters then depend on
//! the order). Signatures are computed in parallel ([`MinHasher::signature`]), decisions in
//! order.

use serde::Deserialize;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::document::{Document, DropReason, Verdict};
use super::text::{PrehashedMap, hash_words};

const MERSENNE_61: u64 = (1 << 61) - 1;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MinHashFile {
    pub ngram: usize,
    pub bands: usize,
    pub rows: usize,
    pub seed: u64,
    pub clustering: Clustering,
}

/// When clusters are decided (see the module doc).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Clustering {
    /// Union-find over the whole corpus, then one document kept per cluster.
    #[default]
    Global,
    /// Each document decided on arrival against the documents before it.
    Streaming,
}

impl Default for MinHashFile {
    fn default() -> Self {
        MinHashFile {
            ngram: 5,
            bands: 14,
            rows: 8,
            seed: 1,
            clustering: Clustering::default(),
        }
    }
}

/// The hash family and shingling, shared read-only by the worker threads.
#[derive(Clone, Debug)]
pub struct MinHasher {
    ngram: usize,
    bands: usize,
    rows: usize,
    a: Vec<u64>,
    b: Vec<u64>,
}

#[derive(Debug)]
pub struct MinHashDedup {
    pub hasher: MinHasher,
    tables: Vec<PrehashedMap<u32>>,
    parent: Vec<u32>,
    /// Per root: whether its cluster already holds a removed duplicate.
    has_duplicates: Vec<bool>,
    pub clusters_with_duplicates: u64,
    pub clustering: Clustering,
}

impl MinHashFile {
    pub fn validate(self) -> Result<MinHashDedup, String> {
        if self.ngram == 0 || self.bands == 0 || self.rows == 0 {
            return Err("ngram, bands and rows must all be positive".into());
        }
        if self.bands * self.rows > 4096 {
            return Err(format!(
                "bands * rows = {} hashes is more than 4096",
                self.bands * self.rows
            ));
        }
        Ok(MinHashDedup {
            hasher: MinHasher::new(self.ngram, self.bands, self.rows, self.seed),
            tables: (0..self.bands).map(|_| PrehashedMap::default()).collect(),
            parent: Vec::new(),
            has_duplicates: Vec::new(),
            clusters_with_duplicates: 0,
            clustering: self.clustering,
        })
    }
}

/// `v mod (2^61 - 1)` for `v < 2^122`, without a division.
fn reduce_mersenne(v: u128) -> u64 {
    let folded = (v as u64 & MERSENNE_61) + (v >> 61) as u64;
    let folded = (folded & MERSENNE_61) + (folded >> 61);
    if folded >= MERSENNE_61 {
        folded - MERSENNE_61
    } else {
        folded
    }
}

impl MinHasher {
    pub fn new(ngram: usize, bands: usize, rows: usize, seed: u64) -> Self {
        let count = bands * rows;
        // SplitMix-style expansion of the seed: reproducible on every machine and version.
        let draw =
            |i: u64, salt: u64| xxh3_64_with_seed(&i.to_le_bytes(), seed ^ salt) % MERSENNE_61;
        let a = (0..count as u64)
            .map(|i| draw(i, 0x9E37_79B9_7F4A_7C15).max(1))
            .collect();
        let b = (0..count as u64)
            .map(|i| draw(i, 0xD1B5_4A32_D192_ED03))
            .collect();
        MinHasher {
            ngram,
            bands,
            rows,
            a,
            b,
        }
    }

    /// Hashes of the word n-grams of the lowercased, punctuation-free text; a text shorter than
    /// `ngram` words is one shingle.
    pub fn shingles(&self, text: &str) -> Vec<u64> {
        let mut lowered = String::with_capacity(text.len());
        for c in text.chars() {
            if c.is_alphanumeric() {
                lowered.extend(c.to_lowercase());
            } else {
                lowered.push(' ');
            }
        }
        let words: Vec<u64> = lowered
            .split_whitespace()
            .map(|w| xxh3_64(w.as_bytes()))
            .collect();
        if words.is_empty() {
            return Vec::new();
        }
        if words.len() < self.ngram {
            return vec![hash_words(&words)];
        }
        words.windows(self.ngram).map(hash_words).collect()
    }

    /// The MinHash signature of a set of shingle hashes (empty set: empty signature).
    pub fn signature_of(&self, shingles: &[u64]) -> Vec<u64> {
        if shingles.is_empty() {
            return Vec::new();
        }
        let mut signature = vec![u64::MAX; self.a.len()];
        for &shingle in shingles {
            let x = u128::from(shingle % MERSENNE_61);
            for ((slot, &a), &b) in signature.iter_mut().zip(&self.a).zip(&self.b) {
                let h = reduce_mersenne(u128::from(a) * x + u128::from(b));
                if h < *slot {
                    *slot = h;
                }
            }
        }
        signature
    }

    pub fn signature(&self, text: &str) -> Vec<u64> {
        self.signature_of(&self.shingles(text))
    }

    /// One key per band; two documents are candidates when any band key is equal.
    pub fn band_keys(&self, signature: &[u64]) -> Vec<u64> {
        signature
            .chunks_exact(self.rows)
            .enumerate()
            .map(|(band, rows)| {
                xxh3_64_with_seed(
                    &rows
                        .iter()
                        .flat_map(|r| r.to_le_bytes())
                        .collect::<Vec<u8>>(),
                    band as u64,
                )
            })
            .collect()
    }

    pub fn are_candidates(&self, sig_a: &[u64], sig_b: &[u64]) -> bool {
        sig_a
            .chunks_exact(self.rows)
            .zip(sig_b.chunks_exact(self.rows))
            .any(|(x, y)| x == y)
    }

    /// The probability that two sets of Jaccard similarity `s` become candidates.
    pub fn candidate_probability(&self, s: f64) -> f64 {
        1.0 - (1.0 - s.powi(self.rows as i32)).powi(self.bands as i32)
    }

    pub fn bands(&self) -> usize {
        self.bands
    }
}

impl MinHashDedup {
    fn find(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            let grandparent = self.parent[self.parent[x as usize] as usize];
            self.parent[x as usize] = grandparent;
            x = grandparent;
        }
        x
    }

    /// Global clustering, first pass: indexes a document's band keys and joins it to every
    /// cluster it shares a band with. Returns its node (the order it was observed in), `None`
    /// for a document without words (kept, not indexed).
    pub fn observe(&mut self, band_keys: &[u64]) -> Option<u32> {
        if band_keys.is_empty() {
            return None;
        }
        let me = self.parent.len() as u32;
        self.parent.push(me);
        let mut root = me;
        for (band, &key) in band_keys.iter().enumerate() {
            match self.tables[band].get(&key).copied() {
                Some(other) => {
                    // Union by the smaller index: a root is always its cluster's earliest node.
                    let other_root = self.find(other);
                    let (low, high) = (root.min(other_root), root.max(other_root));
                    self.parent[high as usize] = low;
                    root = low;
                }
                None => {
                    self.tables[band].insert(key, me);
                }
            }
        }
        Some(me)
    }

    /// Global clustering, once every document is observed: counts the clusters with
    /// duplicates and flattens the union-find so that [`Self::is_kept`] is one lookup.
    pub fn finish_clusters(&mut self) {
        let mut has_duplicates = vec![false; self.parent.len()];
        for node in 0..self.parent.len() as u32 {
            let root = self.find(node);
            self.parent[node as usize] = root;
            if root != node {
                has_duplicates[root as usize] = true;
            }
        }
        self.clusters_with_duplicates = has_duplicates.iter().filter(|&&d| d).count() as u64;
        self.has_duplicates = has_duplicates;
    }

    /// Global clustering: whether the observed node is its cluster's kept document (its
    /// earliest), after [`Self::finish_clusters`].
    pub fn is_kept(&self, node: u32) -> bool {
        self.parent[node as usize] == node
    }

    /// The cluster (its earliest node) of an observed node, after [`Self::finish_clusters`].
    pub fn cluster_of(&self, node: u32) -> u32 {
        self.parent[node as usize]
    }

    /// Decides one document from its band keys (from [`MinHasher::band_keys`]; empty for a
    /// document without words, which is kept and not indexed).
    pub fn decide(&mut self, doc: Document, band_keys: &[u64]) -> Verdict {
        if band_keys.is_empty() {
            return Verdict::Keep(doc);
        }
        let me = self.parent.len() as u32;
        self.parent.push(me);
        self.has_duplicates.push(false);
        let mut roots: Vec<u32> = Vec::new();
        for (band, &key) in band_keys.iter().enumerate() {
            match self.tables[band].get(&key).copied() {
                Some(other) => {
                    let root = self.find(other);
                    if !roots.contains(&root) {
                        roots.push(root);
                    }
                }
                None => {
                    self.tables[band].insert(key, me);
                }
            }
        }
        let Some(&keep_root) = roots.iter().min() else {
            return Verdict::Keep(doc);
        };
        for &root in &roots {
            if root != keep_root {
                self.parent[root as usize] = keep_root;
                if self.has_duplicates[root as usize] {
                    self.clusters_with_duplicates -= 1;
                }
            }
        }
        self.parent[me as usize] = keep_root;
        if !std::mem::replace(&mut self.has_duplicates[keep_root as usize], true) {
            self.clusters_with_duplicates += 1;
        }
        Verdict::Drop(doc, DropReason::NearDuplicate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn identical_texts_are_candidates_and_unrelated_are_not() {
        let dedup = MinHashFile::default().validate().unwrap();
        let h = &dedup.hasher;
        let a =
            h.signature("the quick brown fox jumps over the lazy dog near the river bank today");
        let b =
            h.signature("The quick brown fox, jumps over the lazy dog near the river bank today!");
        let c = h
            .signature("completely different words make up this other sentence about nothing much");
        assert_eq!(a, b);
        assert!(h.are_candidates(&a, &b));
        assert!(!h.are_candidates(&a, &c));
    }

    /// Two sets of `union` random shingles sharing `round(s * union)` of them: Jaccard exactly s
    /// up to rounding.
    fn pair(rng: &mut ChaCha8Rng, s: f64, union: usize) -> (Vec<u64>, Vec<u64>) {
        let shared = (s * union as f64).round() as usize;
        let items: Vec<u64> = (0..union).map(|_| rng.random()).collect();
        let (common, rest) = items.split_at(shared);
        let (only_a, only_b) = rest.split_at(rest.len() / 2);
        let a = common.iter().chain(only_a).copied().collect();
        let b = common.iter().chain(only_b).copied().collect();
        (a, b)
    }

    #[test]
    fn candidate_rate_matches_band_formula() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let pairs = 400;
        for (bands, rows) in [(14, 8), (20, 5)] {
            let h = MinHasher::new(5, bands, rows, 3);
            for s in [0.3, 0.5, 0.7, 0.8, 0.9] {
                let hits = (0..pairs)
                    .filter(|_| {
                        let (a, b) = pair(&mut rng, s, 200);
                        h.are_candidates(&h.signature_of(&a), &h.signature_of(&b))
                    })
                    .count();
                let rate = hits as f64 / pairs as f64;
                let expected = h.candidate_probability(s);
                // 4 binomial standard deviations plus a little slack for the hash family.
                let tolerance = 4.0 * (expected * (1.0 - expected) / pairs as f64).sqrt() + 0.02;
                assert!(
                    (rate - expected).abs() <= tolerance,
                    "{bands}x{rows} s={s}: rate {rate:.3} vs formula {expected:.3} (tol {tolerance:.3})"
                );
            }
        }
    }

    #[test]
    fn streaming_keeps_the_first_of_a_cluster() {
        let mut dedup = MinHashFile::default().validate().unwrap();
        let base = "one two three four five six seven eight nine ten eleven twelve thirteen";
        let texts = [
            base,
            "a totally unrelated document with its own distinct words here",
            base,
        ];
        let kept: Vec<bool> = texts
            .iter()
            .map(|t| {
                let keys = dedup.hasher.band_keys(&dedup.hasher.signature(t));
                matches!(
                    dedup.decide(Document::plain("d", *t, "s"), &keys),
                    Verdict::Keep(_)
                )
            })
            .collect();
        assert_eq!(kept, vec![true, true, false]);
        assert_eq!(dedup.clusters_with_duplicates, 1);
    }

    /// Band keys for a document: `shared` holds (band, key) pairs it has in common with others,
    /// every other band gets a key of its own.
    fn keys(own: u64, shared: &[(usize, u64)]) -> Vec<u64> {
        let mut keys: Vec<u64> = (0..14).map(|b| own * 1000 + b as u64).collect();
        for &(band, key) in shared {
            keys[band] = key;
        }
        keys
    }

    /// The clusters as sets of document names, whatever order the documents came in.
    fn global_clusters(docs: &[(&str, Vec<u64>)]) -> Vec<Vec<String>> {
        let mut dedup = MinHashFile::default().validate().unwrap();
        let nodes: Vec<(String, u32)> = docs
            .iter()
            .map(|(name, keys)| (name.to_string(), dedup.observe(keys).unwrap()))
            .collect();
        dedup.finish_clusters();
        let mut by_root: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
        for (name, node) in &nodes {
            by_root
                .entry(dedup.cluster_of(*node))
                .or_default()
                .push(name.clone());
        }
        let kept: Vec<&String> = nodes
            .iter()
            .filter(|(_, n)| dedup.is_kept(*n))
            .map(|(name, _)| name)
            .collect();
        assert_eq!(kept.len(), by_root.len(), "one document kept per cluster");
        let mut clusters: Vec<Vec<String>> = by_root
            .into_values()
            .map(|mut c| {
                c.sort();
                c
            })
            .collect();
        clusters.sort();
        clusters
    }

    #[test]
    fn global_clusters_are_the_same_for_every_arrival_order() {
        // a and b share nothing; c shares a band with each, so all three are one cluster; d and
        // e are a pair; f is alone.
        let docs = vec![
            ("a", keys(1, &[(0, 7)])),
            ("b", keys(2, &[(5, 9)])),
            ("c", keys(3, &[(0, 7), (5, 9)])),
            ("d", keys(4, &[(13, 11)])),
            ("e", keys(5, &[(13, 11)])),
            ("f", keys(6, &[])),
        ];
        let expected = vec![
            vec!["a".to_string(), "b".into(), "c".into()],
            vec!["d".into(), "e".into()],
            vec!["f".into()],
        ];
        // Every rotation and the reverse of each.
        for shift in 0..docs.len() {
            let mut order = docs.clone();
            order.rotate_left(shift);
            assert_eq!(global_clusters(&order), expected, "rotation {shift}");
            order.reverse();
            assert_eq!(
                global_clusters(&order),
                expected,
                "reversed rotation {shift}"
            );
        }
    }

    #[test]
    fn streaming_clusters_depend_on_the_order_the_global_ones_do_not() {
        // The documented gap of streaming: a and b arrive before c links them, so both stay.
        let mut dedup = MinHashFile {
            clustering: Clustering::Streaming,
            ..Default::default()
        }
        .validate()
        .unwrap();
        let kept = [
            keys(1, &[(0, 7)]),
            keys(2, &[(5, 9)]),
            keys(3, &[(0, 7), (5, 9)]),
        ]
        .iter()
        .filter(|k| {
            matches!(
                dedup.decide(Document::plain("d", "x", "s"), k),
                Verdict::Keep(_)
            )
        })
        .count();
        assert_eq!(kept, 2);
        let mut global = MinHashFile::default().validate().unwrap();
        let nodes: Vec<u32> = [
            keys(1, &[(0, 7)]),
            keys(2, &[(5, 9)]),
            keys(3, &[(0, 7), (5, 9)]),
        ]
        .iter()
        .map(|k| global.observe(k).unwrap())
        .collect();
        global.finish_clusters();
        assert_eq!(nodes.iter().filter(|&&n| global.is_kept(n)).count(), 1);
        assert_eq!(global.clusters_with_duplicates, 1);
    }
}
