//! Reading back the work dir after a run: [`FileCollection`] (the request and its bounds, on
//! [`crate::Program::collect_files`]) and [`CollectedFiles`] (what came back, on
//! [`crate::ExecResult::files`]).
//!
//! What it is: a walk of the work dir's regular files, done by the caller's process after the
//! run ended and before the dir is removed. With the work dir on a private tmpfs (which the
//! caller cannot see) the jail's supervisor hands over a descriptor of the tmpfs root when the
//! program ends (see `jail.rs`); the walk starts from that descriptor, and the tmpfs lives until
//! the walk drops it.
//!
//! What it is not: a copy of the dir's metadata (modes, owners, times, empty directories), and
//! not a way out of the jail: every entry is first pinned with an `O_PATH | O_NOFOLLOW`
//! descriptor relative to its parent's descriptor (through the `/proc/self/fd/N/name` path,
//! whose only followed link is the descriptor's own), its type is taken from that descriptor,
//! and a regular file is then read through the pinned inode's own link. A symlink the program made, to `/etc/passwd` or anywhere, is reported in
//! [`CollectedFiles::skipped`] and never read, and so are FIFOs, sockets and device nodes.
//!
//! Invariants: `files` is either the complete set of the dir's regular files (except the
//! program's source file, which the sandbox wrote) or empty with [`CollectedFiles::incomplete`]
//! saying why; never a silent partial set. Paths are relative, `/`-separated, UTF-8, sorted.
//! Files the program made unreadable (`chmod 000`) are made readable by their owner first.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use serde::Serialize;

/// Directories deeper than this make the collection [`Incomplete::TooDeep`].
pub const MAX_COLLECTION_DEPTH: usize = 32;

/// Entries of every kind (directories and skipped ones included) visited before the collection
/// gives up as [`Incomplete::TooManyEntries`]: bounds the walk of a dir full of empty
/// directories or FIFOs, which hold no file bytes.
pub const MAX_COLLECTION_ENTRIES: usize = 16_384;

/// Ask the sandbox to read the work dir's regular files back after the run, within bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileCollection {
    /// Most regular files returned; more make the collection [`Incomplete::TooManyFiles`].
    pub max_files: usize,
    /// Most bytes returned, all files together; more make it [`Incomplete::TooManyBytes`].
    pub max_bytes: u64,
}

impl Default for FileCollection {
    fn default() -> FileCollection {
        FileCollection {
            max_files: 256,
            max_bytes: 8 << 20,
        }
    }
}

/// Why a collection returned no files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Incomplete {
    /// The dir held more than `limit` regular files.
    TooManyFiles { limit: usize },
    /// The regular files held more than `limit` bytes together.
    TooManyBytes { limit: u64 },
    /// Directories nested deeper than `limit`.
    TooDeep { limit: usize },
    /// More than `limit` entries of any kind.
    TooManyEntries { limit: usize },
    /// The dir or an entry could not be read; says which and why.
    Unreadable(String),
}

impl std::fmt::Display for Incomplete {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Incomplete::TooManyFiles { limit } => {
                write!(formatter, "more than {limit} files in the work dir")
            }
            Incomplete::TooManyBytes { limit } => {
                write!(
                    formatter,
                    "more than {limit} bytes of files in the work dir"
                )
            }
            Incomplete::TooDeep { limit } => {
                write!(formatter, "directories nested deeper than {limit}")
            }
            Incomplete::TooManyEntries { limit } => {
                write!(formatter, "more than {limit} entries in the work dir")
            }
            Incomplete::Unreadable(message) => write!(formatter, "unreadable: {message}"),
        }
    }
}

/// The work dir's regular files after a run (see the module doc for the invariants).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CollectedFiles {
    /// Relative path to contents. Empty when `incomplete` is set.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Entries not returned, with what they are: symlinks, FIFOs, sockets, devices, names that
    /// are not UTF-8 (shown lossily).
    pub skipped: Vec<SkippedEntry>,
    /// Set when the bounds were passed or the dir could not be read; `files` is then empty.
    pub incomplete: Option<Incomplete>,
}

/// A work-dir entry that is not a regular file and so was not returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedEntry {
    /// Relative path (lossy UTF-8).
    pub path: String,
    /// `symlink`, `fifo`, `socket`, `device`, or `non_utf8_name`.
    pub kind: &'static str,
}

impl CollectedFiles {
    /// A collection that returned nothing, for `reason`.
    pub(crate) fn incomplete(reason: Incomplete) -> CollectedFiles {
        CollectedFiles {
            incomplete: Some(reason),
            ..CollectedFiles::default()
        }
    }
}

/// Walks `root` (an open directory) within `bounds`; `exclude` is a top-level name left out
/// (the program's source file). The run must have ended.
pub(crate) fn collect(root: File, exclude: &str, bounds: FileCollection) -> CollectedFiles {
    let mut walk = Walk {
        bounds,
        exclude,
        collected: CollectedFiles::default(),
        bytes: 0,
        entries: 0,
    };
    match walk.directory(&root, "", 0) {
        Ok(()) => walk.collected,
        Err(reason) => CollectedFiles {
            // The skipped list stays: it says what was seen before the walk stopped.
            skipped: walk.collected.skipped,
            ..CollectedFiles::incomplete(reason)
        },
    }
}

/// Pins the directory at `path` for [`collect`] (an `O_PATH` descriptor; no symlink followed
/// at its last component).
pub(crate) fn open_root(path: &std::path::Path) -> io::Result<File> {
    pin(path, libc::O_DIRECTORY)
}

struct Walk<'a> {
    bounds: FileCollection,
    exclude: &'a str,
    collected: CollectedFiles,
    bytes: u64,
    entries: usize,
}

/// The path of the inode `handle` holds (a magic link, resolved to that very inode).
fn magic(handle: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()))
}

/// An `O_PATH` descriptor of `path` itself, a symlink included (`O_NOFOLLOW`): opens nothing,
/// needs no permission on the entry, does not block on a FIFO.
fn pin(path: &std::path::Path, flags: libc::c_int) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | flags)
        .open(path)
}

/// Gives the owner the `bits` of permission on the pinned inode when it lacks them (a program
/// may `chmod 000` its files; a caller that is not root owns them but cannot read them then).
fn grant_owner(handle: &File, bits: u32) -> io::Result<()> {
    let mode = handle.metadata()?.permissions().mode();
    if mode & bits == bits {
        return Ok(());
    }
    fs::set_permissions(
        magic(handle),
        fs::Permissions::from_mode((mode & 0o7777) | bits),
    )
}

impl Walk<'_> {
    fn directory(&mut self, dir: &File, prefix: &str, depth: usize) -> Result<(), Incomplete> {
        if depth > MAX_COLLECTION_DEPTH {
            return Err(Incomplete::TooDeep {
                limit: MAX_COLLECTION_DEPTH,
            });
        }
        let shown = if prefix.is_empty() { "." } else { prefix };
        let unreadable = |error: io::Error| Incomplete::Unreadable(format!("{shown}: {error}"));
        grant_owner(dir, 0o500).map_err(unreadable)?;
        let mut names = Vec::new();
        for entry in fs::read_dir(magic(dir)).map_err(unreadable)? {
            names.push(entry.map_err(unreadable)?.file_name());
        }
        names.sort();
        for name in names {
            self.entries += 1;
            if self.entries > MAX_COLLECTION_ENTRIES {
                return Err(Incomplete::TooManyEntries {
                    limit: MAX_COLLECTION_ENTRIES,
                });
            }
            if prefix.is_empty() && name == self.exclude {
                continue;
            }
            let lossy = name.to_string_lossy();
            let path = if prefix.is_empty() {
                lossy.to_string()
            } else {
                format!("{prefix}/{lossy}")
            };
            let unreadable = |error: io::Error| Incomplete::Unreadable(format!("{path}: {error}"));
            let handle = pin(&magic(dir).join(&name), 0).map_err(unreadable)?;
            // The type of what was pinned, never of a link target.
            let kind = handle.metadata().map_err(unreadable)?.file_type();
            let skipped_kind = if kind.is_symlink() {
                Some("symlink")
            } else if kind.is_dir() || kind.is_file() {
                name.to_str().is_none().then_some("non_utf8_name")
            } else {
                use std::os::unix::fs::FileTypeExt;
                Some(if kind.is_fifo() {
                    "fifo"
                } else if kind.is_socket() {
                    "socket"
                } else {
                    "device"
                })
            };
            if let Some(kind) = skipped_kind {
                self.collected.skipped.push(SkippedEntry { path, kind });
            } else if kind.is_dir() {
                self.directory(&handle, &path, depth + 1)?;
            } else {
                self.file(&handle, path)?;
            }
        }
        Ok(())
    }

    fn file(&mut self, handle: &File, path: String) -> Result<(), Incomplete> {
        let unreadable = |error: io::Error| Incomplete::Unreadable(format!("{path}: {error}"));
        if self.collected.files.len() >= self.bounds.max_files {
            return Err(Incomplete::TooManyFiles {
                limit: self.bounds.max_files,
            });
        }
        grant_owner(handle, 0o400).map_err(unreadable)?;
        // Reopened through the pinned inode's own link: what is read is what was checked.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(magic(handle))
            .map_err(unreadable)?;
        let length = file.metadata().map_err(unreadable)?.len();
        let room = self.bounds.max_bytes - self.bytes;
        let too_many_bytes = Incomplete::TooManyBytes {
            limit: self.bounds.max_bytes,
        };
        if length > room {
            return Err(too_many_bytes);
        }
        let mut contents = Vec::with_capacity(length as usize);
        // One byte past the room tells a file that grew from one that fits.
        file.take(room.saturating_add(1))
            .read_to_end(&mut contents)
            .map_err(unreadable)?;
        if contents.len() as u64 > room {
            return Err(too_many_bytes);
        }
        self.bytes += contents.len() as u64;
        self.collected.files.insert(path, contents);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect_dir(dir: &std::path::Path, bounds: FileCollection) -> CollectedFiles {
        collect(open_root(dir).unwrap(), "main.py", bounds)
    }

    #[test]
    fn nested_files_come_back_and_the_source_file_does_not() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("main.py"), b"print(1)").unwrap();
        fs::create_dir_all(dir.path().join("a/b")).unwrap();
        fs::write(dir.path().join("a/b/x.txt"), b"x").unwrap();
        fs::write(dir.path().join("y"), b"yy").unwrap();
        let collected = collect_dir(dir.path(), FileCollection::default());
        assert_eq!(collected.incomplete, None);
        let paths: Vec<&str> = collected.files.keys().map(String::as_str).collect();
        assert_eq!(paths, ["a/b/x.txt", "y"]);
        assert_eq!(collected.files["y"], b"yy");
    }

    #[test]
    fn symlinks_are_skipped_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("passwd")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        let collected = collect_dir(dir.path(), FileCollection::default());
        assert!(collected.files.is_empty(), "{:?}", collected.files.keys());
        assert_eq!(collected.skipped.len(), 2);
        assert!(
            collected
                .skipped
                .iter()
                .all(|entry| entry.kind == "symlink")
        );
    }

    #[test]
    fn the_bounds_empty_the_set_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), vec![0u8; 600]).unwrap();
        fs::write(dir.path().join("b"), vec![0u8; 600]).unwrap();
        let bytes = collect_dir(
            dir.path(),
            FileCollection {
                max_files: 10,
                max_bytes: 1000,
            },
        );
        assert_eq!(
            bytes.incomplete,
            Some(Incomplete::TooManyBytes { limit: 1000 })
        );
        assert!(bytes.files.is_empty());
        let files = collect_dir(
            dir.path(),
            FileCollection {
                max_files: 1,
                max_bytes: 1 << 20,
            },
        );
        assert_eq!(
            files.incomplete,
            Some(Incomplete::TooManyFiles { limit: 1 })
        );
        assert!(files.files.is_empty());
    }

    #[test]
    fn unreadable_files_are_made_readable() {
        let dir = tempfile::tempdir().unwrap();
        let locked = dir.path().join("locked");
        fs::create_dir(&locked).unwrap();
        fs::write(locked.join("f"), b"secret").unwrap();
        fs::set_permissions(locked.join("f"), fs::Permissions::from_mode(0o000)).unwrap();
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
        let collected = collect_dir(dir.path(), FileCollection::default());
        assert_eq!(collected.incomplete, None);
        assert_eq!(collected.files["locked/f"], b"secret");
    }
}
