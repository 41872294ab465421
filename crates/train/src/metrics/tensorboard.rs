//! TensorBoard event files: the run's scalars in the format TensorBoard, `tensorboard.backend`'s
//! `EventFileLoader` and every dashboard built on them read.
//!
//! Format (TensorFlow's `TFRecord` framing of `tensorflow.Event` protocol buffers):
//! - each record is `u64 length (LE) | u32 masked CRC-32C of the length bytes | data |
//!   u32 masked CRC-32C of the data`, where `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8`;
//! - the first event carries `file_version = "brain.Event:2"`; every later one carries
//!   `wall_time` (field 1, double), `step` (field 2, int64) and a `Summary` (field 5) of
//!   `Value { tag (1), simple_value (2, float) }`.
//!
//! Hand-written, about 100 lines, because the only piece needed is this writer of one message
//! shape: the protobuf crates (prost, protobuf) need the `.proto` files and a code generator at
//! build time, and the Rust TensorBoard writers on crates.io are unmaintained or pull in a
//! protobuf runtime of their own. The reader exists for the round-trip tests and checks both
//! CRCs of every record.
//!
//! What it is not: histograms, images, text summaries or graphs; only scalars.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::MetricsError;

/// The event file's name beside `metrics.jsonl` (TensorBoard finds files whose name holds
/// `tfevents`).
pub const EVENTS_FILE: &str = "events.out.tfevents.stoke";

/// The version string TensorBoard expects in a file's first event.
pub const FILE_VERSION: &str = "brain.Event:2";

/// Appends scalar events to a new event file.
pub struct EventWriter {
    path: PathBuf,
    file: BufWriter<File>,
    record: Vec<u8>,
}

impl EventWriter {
    /// Creates (or replaces) the file and writes its version event.
    pub fn create(path: &Path) -> Result<EventWriter, MetricsError> {
        let file = File::create(path).map_err(|e| MetricsError::io(path, e))?;
        let mut writer = EventWriter {
            path: path.to_path_buf(),
            file: BufWriter::new(file),
            record: Vec::with_capacity(512),
        };
        let mut event = Vec::new();
        put_double(&mut event, 1, wall_time());
        put_bytes(&mut event, 3, FILE_VERSION.as_bytes());
        writer.write_event(&event)?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One event at `step` holding every scalar (nothing is written for none).
    pub fn write_record(
        &mut self,
        step: u64,
        scalars: &[(String, f32)],
    ) -> Result<(), MetricsError> {
        if scalars.is_empty() {
            return Ok(());
        }
        let mut summary = Vec::new();
        for (tag, value) in scalars {
            let mut entry = Vec::new();
            put_bytes(&mut entry, 1, tag.as_bytes());
            put_key(&mut entry, 2, 5);
            entry.extend_from_slice(&value.to_le_bytes());
            put_bytes(&mut summary, 1, &entry);
        }
        let mut event = Vec::new();
        put_double(&mut event, 1, wall_time());
        put_key(&mut event, 2, 0);
        put_varint(&mut event, step);
        put_bytes(&mut event, 5, &summary);
        self.write_event(&event)?;
        // Each record reaches the OS at once, as the JSONL log's do.
        self.file
            .flush()
            .map_err(|e| MetricsError::io(&self.path, e))
    }

    /// Flushes and fsyncs.
    pub fn flush(&mut self) -> Result<(), MetricsError> {
        self.file
            .flush()
            .and_then(|()| self.file.get_ref().sync_data())
            .map_err(|e| MetricsError::io(&self.path, e))
    }

    fn write_event(&mut self, event: &[u8]) -> Result<(), MetricsError> {
        self.record.clear();
        let length = (event.len() as u64).to_le_bytes();
        self.record.extend_from_slice(&length);
        self.record
            .extend_from_slice(&masked_crc(&length).to_le_bytes());
        self.record.extend_from_slice(event);
        self.record
            .extend_from_slice(&masked_crc(event).to_le_bytes());
        self.file
            .write_all(&self.record)
            .map_err(|e| MetricsError::io(&self.path, e))
    }
}

/// One event read back: `file_version` for the first, else a step's scalars.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub wall_time: f64,
    pub step: u64,
    pub file_version: Option<String>,
    pub scalars: Vec<(String, f32)>,
}

/// Reads every event of a file, checking both CRCs of each record; errors name the record.
pub fn read_events(path: &Path) -> Result<Vec<Event>, MetricsError> {
    let bytes = std::fs::read(path).map_err(|e| MetricsError::io(path, e))?;
    let bad = |index: usize, message: &str| MetricsError::BadLine {
        path: path.to_path_buf(),
        line: index + 1,
        message: format!("event record: {message}"),
    };
    let mut events = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let index = events.len();
        let header = bytes
            .get(at..at + 12)
            .ok_or_else(|| bad(index, "truncated header"))?;
        let length = u64::from_le_bytes(header[..8].try_into().unwrap_or_default()) as usize;
        if u32::from_le_bytes(header[8..12].try_into().unwrap_or_default())
            != masked_crc(&header[..8])
        {
            return Err(bad(index, "length CRC mismatch"));
        }
        let data = bytes
            .get(at + 12..at + 12 + length)
            .ok_or_else(|| bad(index, "truncated data"))?;
        let crc = bytes
            .get(at + 12 + length..at + 16 + length)
            .ok_or_else(|| bad(index, "truncated data CRC"))?;
        if u32::from_le_bytes(crc.try_into().unwrap_or_default()) != masked_crc(data) {
            return Err(bad(index, "data CRC mismatch"));
        }
        events.push(parse_event(data).map_err(|m| bad(index, m))?);
        at += 16 + length;
    }
    Ok(events)
}

fn parse_event(data: &[u8]) -> Result<Event, &'static str> {
    let mut event = Event {
        wall_time: 0.0,
        step: 0,
        file_version: None,
        scalars: Vec::new(),
    };
    for (field, value) in Fields::new(data) {
        match (field?, value) {
            (1, Field::Fixed64(bits)) => event.wall_time = f64::from_bits(bits),
            (2, Field::Varint(step)) => event.step = step,
            (3, Field::Bytes(text)) => {
                event.file_version =
                    Some(String::from_utf8(text.to_vec()).map_err(|_| "file_version not UTF-8")?)
            }
            (5, Field::Bytes(summary)) => {
                for (field, value) in Fields::new(summary) {
                    let (1, Field::Bytes(entry)) = (field?, value) else {
                        continue;
                    };
                    let (mut tag, mut scalar) = (None, None);
                    for (field, value) in Fields::new(entry) {
                        match (field?, value) {
                            (1, Field::Bytes(t)) => tag = std::str::from_utf8(t).ok(),
                            (2, Field::Fixed32(bits)) => scalar = Some(f32::from_bits(bits)),
                            _ => {}
                        }
                    }
                    if let (Some(tag), Some(scalar)) = (tag, scalar) {
                        event.scalars.push((tag.to_string(), scalar));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(event)
}

enum Field<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(&'a [u8]),
}

/// The fields of one protobuf message; a malformed one ends the walk with an error.
struct Fields<'a> {
    data: &'a [u8],
    at: usize,
    failed: bool,
}

impl<'a> Fields<'a> {
    fn new(data: &'a [u8]) -> Fields<'a> {
        Fields {
            data,
            at: 0,
            failed: false,
        }
    }

    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.data.get(self.at)?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let slice = self.data.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(slice)
    }

    fn field(&mut self) -> Option<(u64, Field<'a>)> {
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => Field::Fixed64(u64::from_le_bytes(self.take(8)?.try_into().ok()?)),
            2 => {
                let n = usize::try_from(self.varint()?).ok()?;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().ok()?)),
            _ => return None,
        };
        Some((key >> 3, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = (Result<u64, &'static str>, Field<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.data.len() {
            return None;
        }
        match self.field() {
            Some((number, value)) => Some((Ok(number), value)),
            None => {
                self.failed = true;
                Some((Err("malformed protobuf field"), Field::Varint(0)))
            }
        }
    }
}

fn put_key(out: &mut Vec<u8>, field: u64, wire_type: u64) {
    put_varint(out, (field << 3) | wire_type);
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_double(out: &mut Vec<u8>, field: u64, value: f64) {
    put_key(out, field, 1);
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// TFRecord's masked CRC-32C.
pub fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masked_crc_matches_tensorflows_known_value() {
        // CRC-32C("123456789") = 0xE3069283 (the Castagnoli check value), masked as TFRecord does.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        // TFRecord's mask, ((c >> 15) | (c << 17)) + 0xa282ead8, worked by hand for that value.
        assert_eq!(masked_crc(b"123456789"), 0xC78A_B0E5);
    }

    #[test]
    fn scalars_written_are_read_back_with_their_steps_and_tags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EVENTS_FILE);
        let mut writer = EventWriter::create(&path).unwrap();
        writer
            .write_record(1, &[("loss".into(), 2.5), ("lr".into(), 1e-3)])
            .unwrap();
        writer
            .write_record(300, &[("eval/loss".into(), f32::NAN)])
            .unwrap();
        writer.write_record(301, &[]).unwrap();
        writer.flush().unwrap();
        let events = read_events(&path).unwrap();
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[0].file_version.as_deref(), Some(FILE_VERSION));
        assert_eq!(events[1].step, 1);
        assert_eq!(
            events[1].scalars,
            vec![("loss".to_string(), 2.5), ("lr".to_string(), 1e-3)]
        );
        assert_eq!(events[2].step, 300);
        assert!(events[2].scalars[0].1.is_nan());
        assert!(events[1].wall_time > 1.6e9);
    }

    #[test]
    fn a_flipped_byte_is_reported_as_a_crc_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EVENTS_FILE);
        let mut writer = EventWriter::create(&path).unwrap();
        writer.write_record(7, &[("loss".into(), 1.0)]).unwrap();
        writer.flush().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 6;
        bytes[last] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let error = read_events(&path).unwrap_err().to_string();
        assert!(error.contains("data CRC mismatch"), "{error}");
    }
}
