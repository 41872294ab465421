//! `manifest.json`: the list of every file in a checkpoint directory with its byte size and
//! xxh3-64 hash, and the verification of a directory against it.
//!
//! What it is: the integrity record of one checkpoint. The manifest is written last, after every
//! other file has been written and fsync'd, so its presence means "the writer finished"; its
//! entries mean "these exact bytes". Verification checks sizes first (cheap, catches truncation)
//! and then hashes, and reports every broken file, naming it.
//!
//! What it is not: a security boundary. xxh3 detects accidents (crashes, truncation, bit rot,
//! partial copies), not an adversary, who could rewrite the manifest too. Files inside the
//! directory that the manifest does not list are ignored (nothing in the loader reads them).
//!
//! Invariants: entry paths are relative, '/'-separated, made of plain components (no `..`, no
//! absolute paths), unique, sorted, and never `manifest.json` itself. Hashes are stored as 16
//! lowercase hex digits (a JSON number would lose precision above 2^53 in other tools).

use super::error::{CheckpointError, FileProblem};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Component, Path};

pub const MANIFEST_FILE: &str = "manifest.json";
/// Value of the manifest's `format` field.
pub const MANIFEST_FORMAT: &str = "stoke-checkpoint";
pub const MANIFEST_VERSION: u32 = 1;

/// Streaming read buffer for hashing (large enough that syscalls do not dominate).
const HASH_BUFFER_BYTES: usize = 1 << 20;

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestEntry {
    /// Relative to the checkpoint directory, '/'-separated.
    pub path: String,
    pub bytes: u64,
    pub xxh3_64: u64,
}

/// The validated manifest of one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub step: u64,
    /// Sorted by path.
    pub entries: Vec<ManifestEntry>,
}

/// The on-disk format (serde layer); converted to `Manifest` by `validate`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFile {
    format: String,
    version: u32,
    step: u64,
    files: Vec<ManifestFileEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFileEntry {
    path: String,
    bytes: u64,
    xxh3_64: String,
}

impl Manifest {
    /// Hashes every file under `dir` (recursively, except a `manifest.json` at its top), and
    /// fsyncs each one while it is open, so the data the manifest vouches for is on disk.
    pub fn build(dir: &Path, step: u64) -> Result<Manifest, CheckpointError> {
        let mut relative_paths = Vec::new();
        collect_files(dir, "", &mut relative_paths)?;
        relative_paths.retain(|p| p != MANIFEST_FILE);
        relative_paths.sort();
        let mut entries = Vec::with_capacity(relative_paths.len());
        for path in relative_paths {
            let full = dir.join(&path);
            let (bytes, xxh3_64) = hash_file(&full, true)?;
            entries.push(ManifestEntry {
                path,
                bytes,
                xxh3_64,
            });
        }
        Ok(Manifest { step, entries })
    }

    /// Writes `<dir>/manifest.json` and fsyncs it (the directory is synced by the caller).
    pub fn write(&self, dir: &Path) -> Result<(), CheckpointError> {
        let file_format = ManifestFile {
            format: MANIFEST_FORMAT.into(),
            version: MANIFEST_VERSION,
            step: self.step,
            files: self
                .entries
                .iter()
                .map(|e| ManifestFileEntry {
                    path: e.path.clone(),
                    bytes: e.bytes,
                    xxh3_64: format!("{:016x}", e.xxh3_64),
                })
                .collect(),
        };
        let path = dir.join(MANIFEST_FILE);
        let mut text = serde_json::to_string_pretty(&file_format)
            .map_err(|e| CheckpointError::io(&path, std::io::Error::other(e)))?;
        text.push('\n');
        write_synced(&path, text.as_bytes())
    }

    /// Whether the manifest lists `relative_path`.
    pub fn lists(&self, relative_path: &str) -> bool {
        self.entries
            .binary_search_by(|e| e.path.as_str().cmp(relative_path))
            .is_ok()
    }

    /// Total bytes of the listed files.
    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }
}

/// Reads and validates `<checkpoint>/manifest.json` (no file is checked against it).
pub fn read_manifest(checkpoint: &Path) -> Result<Manifest, CheckpointError> {
    if !checkpoint.is_dir() {
        return Err(CheckpointError::NotADirectory(checkpoint.to_path_buf()));
    }
    let path = checkpoint.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CheckpointError::ManifestMissing {
                checkpoint: checkpoint.to_path_buf(),
            });
        }
        Err(e) => return Err(CheckpointError::io(&path, e)),
    };
    let malformed = |field: &str, message: String| CheckpointError::ManifestMalformed {
        path: path.clone(),
        field: field.into(),
        message,
    };
    let parsed: ManifestFile =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(&text))
            .map_err(|e| malformed(&e.path().to_string(), e.inner().to_string()))?;
    if parsed.format != MANIFEST_FORMAT {
        return Err(malformed(
            "format",
            format!("expected {MANIFEST_FORMAT:?}, found {:?}", parsed.format),
        ));
    }
    if parsed.version != MANIFEST_VERSION {
        return Err(malformed(
            "version",
            format!(
                "unsupported version {} (this build reads {MANIFEST_VERSION})",
                parsed.version
            ),
        ));
    }
    let mut seen = BTreeSet::new();
    let mut entries = Vec::with_capacity(parsed.files.len());
    for (index, entry) in parsed.files.into_iter().enumerate() {
        let field = format!("files[{index}]");
        if !is_plain_relative(&entry.path) || entry.path == MANIFEST_FILE {
            return Err(malformed(
                &format!("{field}.path"),
                format!(
                    "{:?} is not a plain relative path inside the checkpoint",
                    entry.path
                ),
            ));
        }
        if !seen.insert(entry.path.clone()) {
            return Err(malformed(
                &format!("{field}.path"),
                format!("{:?} is listed twice", entry.path),
            ));
        }
        let xxh3_64 = parse_hash(&entry.xxh3_64).ok_or_else(|| {
            malformed(
                &format!("{field}.xxh3_64"),
                format!("{:?} is not 16 hex digits", entry.xxh3_64),
            )
        })?;
        entries.push(ManifestEntry {
            path: entry.path,
            bytes: entry.bytes,
            xxh3_64,
        });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Manifest {
        step: parsed.step,
        entries,
    })
}

/// Checks every file the manifest lists (size, then xxh3-64) and that the manifest lists each
/// of `required` files. Returns the manifest when everything matches; otherwise the first
/// manifest-level error, or `CheckpointError::Corrupt` with every broken file.
pub fn verify_files(checkpoint: &Path, required: &[&str]) -> Result<Manifest, CheckpointError> {
    let manifest = read_manifest(checkpoint)?;
    if let Some(file) = required.iter().find(|f| !manifest.lists(f)) {
        return Err(CheckpointError::ManifestIncomplete {
            path: checkpoint.join(MANIFEST_FILE),
            file: (*file).to_string(),
        });
    }
    let mut problems = Vec::new();
    for entry in &manifest.entries {
        let path = checkpoint.join(&entry.path);
        let found_bytes = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) => {
                problems.push(FileProblem::Missing { path });
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                problems.push(FileProblem::Missing { path });
                continue;
            }
            Err(e) => return Err(CheckpointError::io(&path, e)),
        };
        if found_bytes != entry.bytes {
            let expected_bytes = entry.bytes;
            problems.push(if found_bytes < expected_bytes {
                FileProblem::Truncated {
                    path,
                    expected_bytes,
                    found_bytes,
                }
            } else {
                FileProblem::Oversized {
                    path,
                    expected_bytes,
                    found_bytes,
                }
            });
            continue;
        }
        let (_, found_xxh3) = hash_file(&path, false)?;
        if found_xxh3 != entry.xxh3_64 {
            problems.push(FileProblem::HashMismatch {
                path,
                expected_xxh3: entry.xxh3_64,
                found_xxh3,
            });
        }
    }
    if problems.is_empty() {
        Ok(manifest)
    } else {
        Err(CheckpointError::Corrupt {
            checkpoint: checkpoint.to_path_buf(),
            problems,
        })
    }
}

/// Byte length and xxh3-64 of a file, streamed; with `sync`, the file is also fsync'd.
pub fn hash_file(path: &Path, sync: bool) -> Result<(u64, u64), CheckpointError> {
    let mut file = File::open(path).map_err(|e| CheckpointError::io(path, e))?;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buffer = vec![0u8; HASH_BUFFER_BYTES];
    let mut total = 0u64;
    loop {
        let read = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CheckpointError::io(path, e)),
        };
        hasher.update(&buffer[..read]);
        total += read as u64;
    }
    if sync {
        file.sync_all().map_err(|e| CheckpointError::io(path, e))?;
    }
    Ok((total, hasher.digest()))
}

/// Writes `bytes` to `path` (created or truncated) and fsyncs it.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut file = File::create(path).map_err(|e| CheckpointError::io(path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| CheckpointError::io(path, e))
}

/// fsyncs `dir` and every directory below it, deepest first, so that the directory entries of
/// the files (and of the subdirectories) are durable before the tree is renamed into place.
pub fn sync_dir_tree(dir: &Path) -> Result<(), CheckpointError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| CheckpointError::io(dir, e))?;
        let kind = entry
            .file_type()
            .map_err(|e| CheckpointError::io(entry.path(), e))?;
        if kind.is_dir() {
            sync_dir_tree(&entry.path())?;
        }
    }
    sync_dir(dir)
}

/// fsyncs one directory (its entries: creations, renames, removals).
pub fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| CheckpointError::io(dir, e))
    }
    #[cfg(not(unix))]
    {
        // Directories cannot be opened as files here; renames are durable by the OS's rules.
        let _ = dir;
        Ok(())
    }
}

/// Relative paths (with '/') of every regular file under `dir`.
fn collect_files(dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<(), CheckpointError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| CheckpointError::io(dir, e))?;
        let name = entry.file_name().into_string().map_err(|name| {
            CheckpointError::io(
                dir.join(&name),
                std::io::Error::other("file name is not valid UTF-8"),
            )
        })?;
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let kind = entry
            .file_type()
            .map_err(|e| CheckpointError::io(entry.path(), e))?;
        if kind.is_dir() {
            collect_files(&entry.path(), &relative, out)?;
        } else {
            out.push(relative);
        }
    }
    Ok(())
}

fn is_plain_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\\')
        && path.split('/').all(|part| !part.is_empty())
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

fn parse_hash(text: &str) -> Option<u64> {
    if text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        u64::from_str_radix(text, 16).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_relative_paths_only() {
        assert!(is_plain_relative("model/config.json"));
        assert!(!is_plain_relative("../escape"));
        assert!(!is_plain_relative("/etc/passwd"));
        assert!(!is_plain_relative("a//b"));
        assert!(!is_plain_relative("./a"));
        assert!(!is_plain_relative(""));
    }

    #[test]
    fn hash_text_round_trips() {
        let value = 0x00ab_cdef_0123_4567_u64;
        assert_eq!(parse_hash(&format!("{value:016x}")), Some(value));
        assert_eq!(parse_hash("abc"), None);
        assert_eq!(parse_hash("zzzzzzzzzzzzzzzz"), None);
    }
}
