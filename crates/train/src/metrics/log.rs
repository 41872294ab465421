//! The one metrics log of every training command: `<run>/metrics.jsonl`, one JSON record per
//! line, with the same records as TensorBoard scalars in `<run>/events.out.tfevents.stoke`.
//!
//! What it is: [`RunLog<R>`], generic over the command's record type ([`LogRecord`]: `stoke
//! train`'s `MetricRecord`, `stoke dpo`'s `PairRecord`, `stoke grpo`'s `GrpoRecord`), so the
//! append, durability, resume-truncation and torn-line rules are written once.
//! What it is not: the records themselves (each command owns its typed record), printing
//! (the monitors) or charts (the run reports).
//!
//! Invariants:
//! - Append-only while a run is alive; every `append` reaches the OS before it returns (one
//!   `write_all` per record, so never half a line from us), so a process killed with SIGKILL
//!   loses no complete record. `flush` fsyncs; a trainer calls it before it saves a checkpoint.
//! - `open(path, None)` starts a fresh log (an existing file is replaced). `open(path,
//!   Some(step))` is a resume from the checkpoint of `step`: the file is rewritten atomically
//!   (temp file, fsync, rename) keeping exactly the records with `step <= step`, so a resumed
//!   run's log holds the same records as an uninterrupted run. A torn last line (the write a
//!   kill interrupted) is dropped there; any other unreadable line is an error naming its line.
//! - The TensorBoard file is derived from the JSONL log, never the other way round: on open it
//!   is rewritten from the kept records, then every appended record is appended to it too. A
//!   record's scalars are its numeric fields (nested objects joined with `/`), tagged by the
//!   field name for `kind = "step"` records and `<kind>/<field>` otherwise (`eval/loss`).

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::MetricsError;
use super::tensorboard::{EVENTS_FILE, EventWriter};

/// A line of a metrics log: a typed record that knows its optimizer step.
pub trait LogRecord: Serialize + DeserializeOwned {
    /// The optimizer step the record belongs to (resume keeps the records up to a step).
    fn step(&self) -> u64;
}

/// Append-only JSONL writer of a run's records, mirrored into TensorBoard scalars.
pub struct RunLog<R> {
    path: PathBuf,
    file: File,
    /// Reused encoding buffer, so one record is one `write_all`.
    line: Vec<u8>,
    events: EventWriter,
    records: PhantomData<fn(R)>,
}

impl<R: LogRecord> RunLog<R> {
    /// Opens the log of a run (see the module doc for `truncate_after_step`).
    pub fn open(path: &Path, truncate_after_step: Option<u64>) -> Result<RunLog<R>, MetricsError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(|e| MetricsError::io(parent, e))?;
        }
        let kept: Vec<R> = match truncate_after_step {
            Some(last_step) if path.exists() => read_records::<R>(path, true)?
                .into_iter()
                .filter(|record| record.step() <= last_step)
                .collect(),
            _ => Vec::new(),
        };
        write_atomically(path, &kept)?;
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| MetricsError::io(path, e))?;
        let events_path = path.with_file_name(EVENTS_FILE);
        let mut events = EventWriter::create(&events_path)?;
        for record in &kept {
            events.write_record(record.step(), &scalars(record)?)?;
        }
        events.flush()?;
        Ok(RunLog {
            path: path.to_path_buf(),
            file,
            line: Vec::with_capacity(512),
            events,
            records: PhantomData,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The TensorBoard event file beside the log.
    pub fn events_path(&self) -> &Path {
        self.events.path()
    }

    /// Appends one record as one line; it reaches the OS before this returns.
    pub fn append(&mut self, record: &R) -> Result<(), MetricsError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, record).map_err(MetricsError::Encode)?;
        self.line.push(b'\n');
        self.file
            .write_all(&self.line)
            .map_err(|e| MetricsError::io(&self.path, e))?;
        self.events.write_record(record.step(), &scalars(record)?)
    }

    /// Makes every appended record durable (fsync of both files). Call before a checkpoint.
    pub fn flush(&mut self) -> Result<(), MetricsError> {
        self.file
            .flush()
            .and_then(|()| self.file.sync_data())
            .map_err(|e| MetricsError::io(&self.path, e))?;
        self.events.flush()
    }

    /// Every record of a log; an unreadable line is an error naming its line number.
    pub fn read_all(path: &Path) -> Result<Vec<R>, MetricsError> {
        read_records(path, false)
    }
}

/// The TensorBoard scalars of a record (see the module doc for the tags).
pub fn scalars<R: Serialize>(record: &R) -> Result<Vec<(String, f32)>, MetricsError> {
    let value = serde_json::to_value(record).map_err(MetricsError::Encode)?;
    let mut out = Vec::new();
    let serde_json::Value::Object(fields) = value else {
        return Ok(out);
    };
    let prefix = match fields.get("kind").and_then(|k| k.as_str()) {
        None | Some("step") => String::new(),
        Some(kind) => format!("{kind}/"),
    };
    for (key, value) in &fields {
        if key == "kind" || key == "step" {
            continue;
        }
        flatten(&format!("{prefix}{key}"), value, &mut out);
    }
    Ok(out)
}

fn flatten(tag: &str, value: &serde_json::Value, out: &mut Vec<(String, f32)>) {
    match value {
        serde_json::Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                out.push((tag.to_string(), x as f32));
            }
        }
        // The logs write non-finite floats as these strings (see `metrics::json_float`).
        serde_json::Value::String(s) => {
            let x = match s.as_str() {
                "NaN" => f32::NAN,
                "Infinity" => f32::INFINITY,
                "-Infinity" => f32::NEG_INFINITY,
                _ => return,
            };
            out.push((tag.to_string(), x));
        }
        serde_json::Value::Bool(b) => out.push((tag.to_string(), f32::from(u8::from(*b)))),
        serde_json::Value::Object(fields) => {
            for (key, value) in fields {
                flatten(&format!("{tag}/{key}"), value, out);
            }
        }
        serde_json::Value::Null | serde_json::Value::Array(_) => {}
    }
}

/// Parses a JSONL log. With `drop_torn_tail`, a last line without its newline that does not
/// parse is taken for the write a kill interrupted and dropped.
fn read_records<R: DeserializeOwned>(
    path: &Path,
    drop_torn_tail: bool,
) -> Result<Vec<R>, MetricsError> {
    let file = File::open(path).map_err(|e| MetricsError::io(path, e))?;
    let mut reader = BufReader::new(file);
    let mut records = Vec::new();
    let mut buffer = Vec::new();
    let mut line = 0usize;
    loop {
        buffer.clear();
        let read = reader
            .read_until(b'\n', &mut buffer)
            .map_err(|e| MetricsError::io(path, e))?;
        if read == 0 {
            break;
        }
        line += 1;
        let complete = buffer.ends_with(b"\n");
        let parsed = std::str::from_utf8(&buffer)
            .map_err(|_| "not valid UTF-8".to_string())
            .and_then(|text| {
                let text = text.trim();
                if text.is_empty() {
                    Ok(None)
                } else {
                    serde_json::from_str::<R>(text)
                        .map(Some)
                        .map_err(|e| e.to_string())
                }
            });
        match parsed {
            Ok(Some(record)) => records.push(record),
            Ok(None) => {}
            Err(_) if drop_torn_tail && !complete => break,
            Err(message) => {
                return Err(MetricsError::BadLine {
                    path: path.to_path_buf(),
                    line,
                    message,
                });
            }
        }
    }
    Ok(records)
}

/// Replaces `path` with `records`: temp file in the same folder, fsync, rename, fsync the folder.
fn write_atomically<R: Serialize>(path: &Path, records: &[R]) -> Result<(), MetricsError> {
    let mut text = Vec::new();
    for record in records {
        serde_json::to_writer(&mut text, record).map_err(MetricsError::Encode)?;
        text.push(b'\n');
    }
    replace_file(path, &text)
}

/// Writes `bytes` to `path` through a synced temporary file and a rename.
pub(super) fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), MetricsError> {
    let mut temp_name = path.file_name().unwrap_or_default().to_os_string();
    temp_name.push(".tmp");
    let temp = path.with_file_name(temp_name);
    let mut file = File::create(&temp).map_err(|e| MetricsError::io(&temp, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| MetricsError::io(&temp, e))?;
    drop(file);
    fs::rename(&temp, path).map_err(|e| MetricsError::io(path, e))?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && let Ok(dir) = File::open(parent)
    {
        // Durability of the rename only; some filesystems refuse to sync a folder, which weakens
        // the guarantee after a power cut, so it is not an error.
        let _ = dir.sync_all();
    }
    Ok(())
}
