//! Exact deduplication: a document whose normalized text (lowercased, whitespace runs collapsed
//! to one space, trimmed) was seen before is removed. The fingerprint is xxh3-128, so a false
//! match needs a 128-bit collision; `ahash` is deliberately not used, its output is not stable
//! across versions or machines and fingerprints outlive the process.
//!
//! Fingerprints persist in `state_file` (16 bytes little-endian each, append-only): a later run
//! loads them and removes documents an earlier run already kept.
//!
//! Invariant: the first document with a given fingerprint in reading order is the one kept;
//! fingerprints are computed in parallel ([`ExactDedup::fingerprint`]) and decided in order.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;

use serde::Deserialize;
use xxhash_rust::xxh3::Xxh3;

use super::document::{Document, DropReason, Verdict};

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExactDedupFile {
    pub state_file: Option<PathBuf>,
}

#[derive(Debug)]
pub struct ExactDedup {
    seen: HashSet<u128>,
    new_fingerprints: Vec<u128>,
    state_file: Option<PathBuf>,
    pub loaded: usize,
}

impl ExactDedupFile {
    pub fn validate(self) -> Result<ExactDedup, String> {
        let mut seen = HashSet::new();
        if let Some(path) = &self.state_file
            && path.exists()
        {
            let bytes =
                std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if bytes.len() % 16 != 0 {
                return Err(format!(
                    "{}: {} bytes is not a whole number of 16-byte fingerprints",
                    path.display(),
                    bytes.len()
                ));
            }
            for chunk in bytes.chunks_exact(16) {
                let mut raw = [0u8; 16];
                raw.copy_from_slice(chunk);
                seen.insert(u128::from_le_bytes(raw));
            }
        }
        let loaded = seen.len();
        Ok(ExactDedup {
            seen,
            new_fingerprints: Vec::new(),
            state_file: self.state_file,
            loaded,
        })
    }
}

impl ExactDedup {
    /// xxh3-128 of the normalized text, streamed without building the normalized string.
    pub fn fingerprint(text: &str) -> u128 {
        let mut hasher = Xxh3::new();
        let mut buf = [0u8; 4];
        let mut pending_space = false;
        let mut started = false;
        for c in text.chars() {
            if c.is_whitespace() {
                pending_space = started;
                continue;
            }
            if pending_space {
                hasher.update(b" ");
                pending_space = false;
            }
            started = true;
            for lower in c.to_lowercase() {
                hasher.update(lower.encode_utf8(&mut buf).as_bytes());
            }
        }
        hasher.digest128()
    }

    pub fn decide(&mut self, doc: Document, fingerprint: u128) -> Verdict {
        if self.seen.insert(fingerprint) {
            self.new_fingerprints.push(fingerprint);
            Verdict::Keep(doc)
        } else {
            Verdict::Drop(doc, DropReason::ExactDuplicate)
        }
    }

    /// Appends this run's new fingerprints to the state file.
    pub fn persist(&mut self) -> Result<(), String> {
        let Some(path) = &self.state_file else {
            return Ok(());
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let bytes: Vec<u8> = self
            .new_fingerprints
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        file.write_all(&bytes)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        self.new_fingerprints.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(dedup: &mut ExactDedup, text: &str) -> bool {
        matches!(
            dedup.decide(
                Document::plain("d", text, "s"),
                ExactDedup::fingerprint(text)
            ),
            Verdict::Keep(_)
        )
    }

    #[test]
    fn normalization_ignores_case_and_whitespace_only() {
        assert_eq!(
            ExactDedup::fingerprint("Hello  World\n"),
            ExactDedup::fingerprint(" hello world")
        );
        assert_ne!(
            ExactDedup::fingerprint("hello world"),
            ExactDedup::fingerprint("hello, world")
        );
        assert_ne!(
            ExactDedup::fingerprint("helloworld"),
            ExactDedup::fingerprint("hello world")
        );
    }

    #[test]
    fn second_copy_is_removed() {
        let mut dedup = ExactDedupFile::default().validate().unwrap();
        assert!(decide(&mut dedup, "a text"));
        assert!(!decide(&mut dedup, "A  TEXT"));
        assert!(decide(&mut dedup, "another text"));
    }

    #[test]
    fn persisted_fingerprints_dedup_a_later_run() {
        let dir = tempfile::tempdir().unwrap();
        let file = ExactDedupFile {
            state_file: Some(dir.path().join("state/exact.xxh3")),
        };
        let mut first = file.clone().validate().unwrap();
        assert!(decide(&mut first, "seen in run one"));
        first.persist().unwrap();
        let mut second = file.validate().unwrap();
        assert_eq!(second.loaded, 1);
        assert!(!decide(&mut second, "seen in run one"));
        assert!(decide(&mut second, "new in run two"));
    }

    #[test]
    fn corrupt_state_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.xxh3");
        std::fs::write(&path, [1u8; 17]).unwrap();
        let err = ExactDedupFile {
            state_file: Some(path),
        }
        .validate()
        .unwrap_err();
        assert!(err.contains("bad.xxh3"), "{err}");
    }
}
