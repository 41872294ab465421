//! Token shards: the memory-mappable binary files that hold tokenized documents for training.
//!
//! A shard is ONE file, `<prefix>-<NNNNN>.shard`, that holds whole documents (a document never
//! spans two shards). Layout, all integers little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `b"STKSHARD"` |
//! | 8 | 4 | format version, `u32` = 1 |
//! | 12 | 4 | token width in bytes, `u32`: 2 (`u16` tokens) or 4 (`u32` tokens) |
//! | 16 | 8 | vocabulary size, `u64` (every token id is `< vocab_size`) |
//! | 24 | 8 | number of tokens `T`, `u64` |
//! | 32 | 8 | number of documents `D`, `u64` |
//! | 40 | 8 | xxh3-64 checksum (seed 0) of every byte from offset 64 to the end of the file |
//! | 48 | 16 | reserved, zero |
//! | 64 | `T * width` | the tokens of all documents, back to back |
//! | .. | 0-7 | zero padding to the next multiple of 8 |
//! | .. | `(D + 1) * 8` | document index: `u64` token offsets, `index[0] = 0`, `index[D] = T`, non-decreasing; document `d` is `tokens[index[d]..index[d+1]]` |
//!
//! The token width is 2 when `vocab_size <= 65_536`, else 4, so the token array of a mapped file
//! is aligned for its type and is read in place (zero-copy) through [`Tokens`].
//!
//! Invariants: a file that exists under its final name is complete (the writer writes
//! `<name>.tmp` and renames it after the last byte and the header are on disk); [`ShardReader`]
//! rejects a file whose size, magic, version, width, index or checksum disagree, naming the file.
//! Not checked on open: that token ids are below `vocab_size` (that costs a pass over every
//! token; [`ShardReader::check_token_range`] does it on demand).
//!
//! What this is not: a loader (see [`crate::loader`]) or a tokenizer; it stores token ids only.

#![allow(unsafe_code)] // memmap2::Mmap::map is unsafe; see the SAFETY note in `ShardReader::open`.

#[cfg(target_endian = "big")]
compile_error!(
    "stoke shards are little-endian and read in place; big-endian hosts are unsupported"
);

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

/// The first 8 bytes of every shard.
pub const MAGIC: &[u8; 8] = b"STKSHARD";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
/// Size of the fixed header in bytes.
pub const HEADER_BYTES: usize = 64;
/// File name extension of a finished shard.
pub const EXTENSION: &str = "shard";

/// Errors reading or writing shards; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a stoke shard (bad magic)")]
    BadMagic { path: PathBuf },
    #[error("{path}: unsupported shard version {version} (this build reads {VERSION})")]
    BadVersion { path: PathBuf, version: u32 },
    #[error("{path}: invalid token width {width} (expected 2 or 4)")]
    BadWidth { path: PathBuf, width: u32 },
    #[error("{path}: truncated or oversized: header promises {expected} bytes, file has {actual}")]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error(
        "{path}: checksum mismatch (stored {stored:#018x}, computed {computed:#018x}): file is corrupt"
    )]
    Checksum {
        path: PathBuf,
        stored: u64,
        computed: u64,
    },
    #[error("{path}: corrupt document index: {detail}")]
    BadIndex { path: PathBuf, detail: String },
    #[error(
        "{path}: token {token} at position {position} is outside the vocabulary of {vocab_size}"
    )]
    TokenOutOfRange {
        path: PathBuf,
        token: u32,
        position: u64,
        vocab_size: u64,
    },
    #[error("document of {len} tokens does not fit the shard size limit of {limit} tokens")]
    DocumentTooLarge { len: usize, limit: u64 },
}

/// Width of the stored tokens, chosen from the vocabulary size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TokenWidth {
    U16,
    U32,
}

impl TokenWidth {
    /// `U16` when every id of a `vocab_size` vocabulary fits in 16 bits.
    pub fn for_vocab(vocab_size: u64) -> Self {
        if vocab_size <= 1 << 16 {
            TokenWidth::U16
        } else {
            TokenWidth::U32
        }
    }
    pub fn bytes(self) -> usize {
        match self {
            TokenWidth::U16 => 2,
            TokenWidth::U32 => 4,
        }
    }
}

/// Settings of a [`ShardWriter`].
#[derive(Clone, Debug)]
pub struct ShardWriterConfig {
    /// Directory the shards go to (created if missing).
    pub dir: PathBuf,
    /// File name prefix: shards are `<prefix>-00000.shard`, `<prefix>-00001.shard`, ...
    pub prefix: String,
    pub vocab_size: u64,
    /// Start a new shard before a document would take the current one past this many tokens.
    pub max_tokens_per_shard: u64,
}

/// What one finished shard holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardSummary {
    pub path: PathBuf,
    pub num_tokens: u64,
    pub num_docs: u64,
    pub checksum: u64,
}

/// Streams documents into a directory of shards, rolling over to a new file by size.
pub struct ShardWriter {
    config: ShardWriterConfig,
    width: TokenWidth,
    open: Option<OpenShard>,
    finished: Vec<ShardSummary>,
}

struct OpenShard {
    final_path: PathBuf,
    temp_path: PathBuf,
    out: BufWriter<File>,
    hasher: Xxh3,
    offsets: Vec<u64>,
    num_tokens: u64,
    scratch: Vec<u8>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ShardError + '_ {
    move |source| ShardError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl ShardWriter {
    pub fn new(config: ShardWriterConfig) -> Result<Self, ShardError> {
        std::fs::create_dir_all(&config.dir).map_err(io_err(&config.dir))?;
        let width = TokenWidth::for_vocab(config.vocab_size);
        Ok(ShardWriter {
            config,
            width,
            open: None,
            finished: Vec::new(),
        })
    }

    pub fn width(&self) -> TokenWidth {
        self.width
    }

    /// Appends one document. Token ids must be `< vocab_size` (checked: an out-of-range id is an
    /// error, since it would be silently truncated in a `u16` shard).
    pub fn push_document(&mut self, tokens: &[u32]) -> Result<(), ShardError> {
        let limit = self.config.max_tokens_per_shard.max(1);
        if tokens.len() as u64 > limit {
            return Err(ShardError::DocumentTooLarge {
                len: tokens.len(),
                limit,
            });
        }
        if let Some((position, &token)) = tokens
            .iter()
            .enumerate()
            .find(|(_, t)| u64::from(**t) >= self.config.vocab_size)
        {
            let path = self
                .open
                .as_ref()
                .map(|o| o.final_path.clone())
                .unwrap_or_default();
            return Err(ShardError::TokenOutOfRange {
                path,
                token,
                position: position as u64,
                vocab_size: self.config.vocab_size,
            });
        }
        let would_overflow = self
            .open
            .as_ref()
            .is_some_and(|o| o.num_tokens + tokens.len() as u64 > limit);
        if would_overflow {
            self.finish_current()?;
        }
        if self.open.is_none() {
            self.open = Some(self.start_shard()?);
        }
        let width = self.width;
        let Some(shard) = self.open.as_mut() else {
            unreachable!("opened above")
        };
        shard.scratch.clear();
        match width {
            TokenWidth::U16 => {
                for &t in tokens {
                    shard.scratch.extend_from_slice(&(t as u16).to_le_bytes());
                }
            }
            TokenWidth::U32 => {
                for &t in tokens {
                    shard.scratch.extend_from_slice(&t.to_le_bytes());
                }
            }
        }
        shard
            .out
            .write_all(&shard.scratch)
            .map_err(io_err(&shard.temp_path))?;
        shard.hasher.update(&shard.scratch);
        shard.num_tokens += tokens.len() as u64;
        shard.offsets.push(shard.num_tokens);
        Ok(())
    }

    /// Finalizes the open shard (if any) and returns every shard written.
    pub fn finish(mut self) -> Result<Vec<ShardSummary>, ShardError> {
        self.finish_current()?;
        Ok(std::mem::take(&mut self.finished))
    }

    fn start_shard(&self) -> Result<OpenShard, ShardError> {
        let index = self.finished.len();
        let name = format!("{}-{index:05}.{EXTENSION}", self.config.prefix);
        let final_path = self.config.dir.join(&name);
        let temp_path = self.config.dir.join(format!("{name}.tmp"));
        let file = File::create(&temp_path).map_err(io_err(&temp_path))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        // Placeholder header; the real one is written by `finish_current`.
        out.write_all(&[0u8; HEADER_BYTES])
            .map_err(io_err(&temp_path))?;
        Ok(OpenShard {
            final_path,
            temp_path,
            out,
            hasher: Xxh3::new(),
            offsets: vec![0],
            num_tokens: 0,
            scratch: Vec::new(),
        })
    }

    fn finish_current(&mut self) -> Result<(), ShardError> {
        let Some(mut shard) = self.open.take() else {
            return Ok(());
        };
        let path = shard.temp_path.clone();
        let token_bytes = shard.num_tokens * self.width.bytes() as u64;
        let padding = vec![0u8; padding_after(token_bytes)];
        shard.out.write_all(&padding).map_err(io_err(&path))?;
        shard.hasher.update(&padding);
        let mut index_bytes = Vec::with_capacity(shard.offsets.len() * 8);
        for offset in &shard.offsets {
            index_bytes.extend_from_slice(&offset.to_le_bytes());
        }
        shard.out.write_all(&index_bytes).map_err(io_err(&path))?;
        shard.hasher.update(&index_bytes);
        let header = Header {
            width: self.width,
            vocab_size: self.config.vocab_size,
            num_tokens: shard.num_tokens,
            num_docs: shard.offsets.len() as u64 - 1,
            checksum: shard.hasher.digest(),
        };
        let mut file = shard.out.into_inner().map_err(|e| ShardError::Io {
            path: path.clone(),
            source: e.into_error(),
        })?;
        file.seek(SeekFrom::Start(0)).map_err(io_err(&path))?;
        file.write_all(&header.to_bytes()).map_err(io_err(&path))?;
        file.sync_all().map_err(io_err(&path))?;
        drop(file);
        std::fs::rename(&path, &shard.final_path).map_err(io_err(&shard.final_path))?;
        self.finished.push(ShardSummary {
            path: shard.final_path,
            num_tokens: header.num_tokens,
            num_docs: header.num_docs,
            checksum: header.checksum,
        });
        Ok(())
    }
}

fn padding_after(token_bytes: u64) -> usize {
    ((8 - token_bytes % 8) % 8) as usize
}

#[derive(Clone, Copy, Debug)]
struct Header {
    width: TokenWidth,
    vocab_size: u64,
    num_tokens: u64,
    num_docs: u64,
    checksum: u64,
}

impl Header {
    fn to_bytes(self) -> [u8; HEADER_BYTES] {
        let mut bytes = [0u8; HEADER_BYTES];
        bytes[0..8].copy_from_slice(MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&(self.width.bytes() as u32).to_le_bytes());
        bytes[16..24].copy_from_slice(&self.vocab_size.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.num_tokens.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.num_docs.to_le_bytes());
        bytes[40..48].copy_from_slice(&self.checksum.to_le_bytes());
        bytes
    }

    fn parse(path: &Path, bytes: &[u8]) -> Result<Self, ShardError> {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        if bytes.len() < HEADER_BYTES {
            return Err(ShardError::SizeMismatch {
                path: path.to_path_buf(),
                expected: HEADER_BYTES as u64,
                actual: bytes.len() as u64,
            });
        }
        if &bytes[0..8] != MAGIC {
            return Err(ShardError::BadMagic {
                path: path.to_path_buf(),
            });
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(ShardError::BadVersion {
                path: path.to_path_buf(),
                version,
            });
        }
        let width = match u32_at(12) {
            2 => TokenWidth::U16,
            4 => TokenWidth::U32,
            width => {
                return Err(ShardError::BadWidth {
                    path: path.to_path_buf(),
                    width,
                });
            }
        };
        Ok(Header {
            width,
            vocab_size: u64_at(16),
            num_tokens: u64_at(24),
            num_docs: u64_at(32),
            checksum: u64_at(40),
        })
    }

    /// Total file size the header implies, or `None` on arithmetic overflow (a corrupt header).
    fn expected_file_size(&self) -> Option<u64> {
        let token_bytes = self.num_tokens.checked_mul(self.width.bytes() as u64)?;
        let index_bytes = self.num_docs.checked_add(1)?.checked_mul(8)?;
        (HEADER_BYTES as u64)
            .checked_add(token_bytes)?
            .checked_add(padding_after(token_bytes) as u64)?
            .checked_add(index_bytes)
    }
}

/// The tokens of one document (or a whole shard), borrowed from the mapped file.
#[derive(Clone, Copy, Debug)]
pub enum Tokens<'a> {
    U16(&'a [u16]),
    U32(&'a [u32]),
}

impl<'a> Tokens<'a> {
    pub fn len(&self) -> usize {
        match self {
            Tokens::U16(t) => t.len(),
            Tokens::U32(t) => t.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn get(&self, i: usize) -> Option<u32> {
        match self {
            Tokens::U16(t) => t.get(i).map(|&x| u32::from(x)),
            Tokens::U32(t) => t.get(i).copied(),
        }
    }
    /// The sub-range `range` (panics like slice indexing when out of bounds).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Tokens<'a> {
        match self {
            Tokens::U16(t) => Tokens::U16(&t[range]),
            Tokens::U32(t) => Tokens::U32(&t[range]),
        }
    }
    /// Appends the tokens, widened to `u32`, to `out`.
    pub fn extend_into(&self, out: &mut Vec<u32>) {
        match self {
            Tokens::U16(t) => out.extend(t.iter().map(|&x| u32::from(x))),
            Tokens::U32(t) => out.extend_from_slice(t),
        }
    }
    pub fn to_vec(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len());
        self.extend_into(&mut out);
        out
    }
}

/// A validated, memory-mapped shard.
pub struct ShardReader {
    path: PathBuf,
    map: memmap2::Mmap,
    header: Header,
    tokens_start: usize,
    index_start: usize,
}

impl std::fmt::Debug for ShardReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardReader")
            .field("path", &self.path)
            .field("header", &self.header)
            .finish()
    }
}

impl ShardReader {
    /// Maps and validates a shard: size, magic, version, width, checksum and index.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ShardError> {
        Self::open_with(path.as_ref(), true)
    }

    /// Like [`ShardReader::open`] but skips the checksum pass (for quick listings).
    pub fn open_unverified(path: impl AsRef<Path>) -> Result<Self, ShardError> {
        Self::open_with(path.as_ref(), false)
    }

    fn open_with(path: &Path, verify_checksum: bool) -> Result<Self, ShardError> {
        let file = File::open(path).map_err(io_err(path))?;
        // SAFETY: the map is read-only and shards are immutable once renamed into place (the
        // writer never reopens a finished shard). If another process truncates the file while
        // it is mapped, reads may fault; that is the documented contract of memmap2 and the
        // reason shards are written under a temporary name first.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err(path))?;
        let header = Header::parse(path, &map)?;
        let actual = map.len() as u64;
        match header.expected_file_size() {
            Some(expected) if expected == actual => {}
            expected => {
                return Err(ShardError::SizeMismatch {
                    path: path.to_path_buf(),
                    expected: expected.unwrap_or(u64::MAX),
                    actual,
                });
            }
        }
        if verify_checksum {
            let computed = xxhash_rust::xxh3::xxh3_64(&map[HEADER_BYTES..]);
            if computed != header.checksum {
                return Err(ShardError::Checksum {
                    path: path.to_path_buf(),
                    stored: header.checksum,
                    computed,
                });
            }
        }
        let token_bytes = header.num_tokens as usize * header.width.bytes();
        let index_start = HEADER_BYTES + token_bytes + padding_after(token_bytes as u64);
        let reader = ShardReader {
            path: path.to_path_buf(),
            map,
            header,
            tokens_start: HEADER_BYTES,
            index_start,
        };
        reader.check_index()?;
        Ok(reader)
    }

    fn check_index(&self) -> Result<(), ShardError> {
        let bad = |detail: String| ShardError::BadIndex {
            path: self.path.clone(),
            detail,
        };
        let index = self.index();
        if index.first() != Some(&0) {
            return Err(bad(format!("index[0] = {:?}, expected 0", index.first())));
        }
        if index.last() != Some(&self.header.num_tokens) {
            return Err(bad(format!(
                "last offset {:?} differs from the token count {}",
                index.last(),
                self.header.num_tokens
            )));
        }
        if let Some(d) = index.windows(2).position(|w| w[1] < w[0]) {
            return Err(bad(format!("offsets decrease at document {d}")));
        }
        Ok(())
    }

    fn index(&self) -> &[u64] {
        let bytes = &self.map[self.index_start..];
        // The index starts at a multiple of 8 in a page-aligned map, so this never splits.
        let (prefix, index, _) = cast_u64(bytes);
        debug_assert!(prefix == 0);
        index
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn vocab_size(&self) -> u64 {
        self.header.vocab_size
    }
    pub fn width(&self) -> TokenWidth {
        self.header.width
    }
    pub fn num_tokens(&self) -> u64 {
        self.header.num_tokens
    }
    pub fn num_docs(&self) -> u64 {
        self.header.num_docs
    }
    pub fn checksum(&self) -> u64 {
        self.header.checksum
    }

    /// Every token of the shard, in place.
    pub fn all_tokens(&self) -> Tokens<'_> {
        let bytes = &self.map[self.tokens_start..self.index_start];
        let n = self.header.num_tokens as usize;
        match self.header.width {
            TokenWidth::U16 => Tokens::U16(&cast_u16(bytes)[..n]),
            TokenWidth::U32 => Tokens::U32(&cast_u32(bytes)[..n]),
        }
    }

    /// Length of document `doc` in tokens, or `None` past the last document.
    pub fn doc_len(&self, doc: u64) -> Option<usize> {
        let index = self.index();
        let d = usize::try_from(doc).ok()?;
        Some((index.get(d + 1)? - index.get(d)?) as usize)
    }

    /// The tokens of document `doc`, in place, or `None` past the last document.
    pub fn document(&self, doc: u64) -> Option<Tokens<'_>> {
        let index = self.index();
        let d = usize::try_from(doc).ok()?;
        let (start, end) = (*index.get(d)? as usize, *index.get(d + 1)? as usize);
        Some(self.all_tokens().slice(start..end))
    }

    /// Checks that every token id is below the vocabulary size (a full pass over the tokens).
    pub fn check_token_range(&self) -> Result<(), ShardError> {
        let vocab = self.header.vocab_size;
        let tokens = self.all_tokens();
        let found = match tokens {
            Tokens::U16(t) => t.iter().position(|&x| u64::from(x) >= vocab),
            Tokens::U32(t) => t.iter().position(|&x| u64::from(x) >= vocab),
        };
        match found {
            None => Ok(()),
            Some(position) => Err(ShardError::TokenOutOfRange {
                path: self.path.clone(),
                token: tokens.get(position).unwrap_or(0),
                position: position as u64,
                vocab_size: vocab,
            }),
        }
    }
}

// Reinterpreting aligned little-endian bytes as integers. `align_to` is the std way; it is
// `unsafe` only because it cannot know that every bit pattern is a valid value, which holds for
// the plain integers used here.
fn cast_u64(bytes: &[u8]) -> (usize, &[u64], usize) {
    // SAFETY: every bit pattern is a valid u64; align_to handles alignment and length.
    let (prefix, mid, suffix) = unsafe { bytes.align_to::<u64>() };
    (prefix.len(), mid, suffix.len())
}

fn cast_u16(bytes: &[u8]) -> &[u16] {
    // SAFETY: every bit pattern is a valid u16. The token array starts at offset 64 of a
    // page-aligned map, so the prefix is empty (asserted) and no token is skipped.
    let (prefix, mid, _) = unsafe { bytes.align_to::<u16>() };
    assert!(prefix.is_empty(), "token array misaligned");
    mid
}

fn cast_u32(bytes: &[u8]) -> &[u32] {
    // SAFETY: as in `cast_u16`, for u32.
    let (prefix, mid, _) = unsafe { bytes.align_to::<u32>() };
    assert!(prefix.is_empty(), "token array misaligned");
    mid
}

/// The finished shards of a directory (`*.shard`), sorted by file name, validated.
pub fn list_shards(dir: &Path) -> Result<Vec<PathBuf>, ShardError> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let path = entry.map_err(io_err(dir))?.path();
        if path.extension().and_then(|e| e.to_str()) == Some(EXTENSION) {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

/// Opens (and validates) every shard of a directory, in file-name order.
pub fn open_dir(dir: &Path) -> Result<Vec<ShardReader>, ShardError> {
    list_shards(dir)?.iter().map(ShardReader::open).collect()
}
