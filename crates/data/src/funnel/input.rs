//! Input: turns the files of a `[[source]]` into a stream of [`Document`]s, reporting every bad
//! record with its location instead of stopping.
//!
//! Formats (one per source):
//! - `jsonl`: one JSON object per line, `.jsonl` or `.jsonl.zst`; the text is `text_field`, the
//!   id `id_field` (else `file:line`), the URL `url_field`; other fields ride along in metadata.
//! - `parquet`: one row per document, same field names (the `parquet` crate's row reader; snappy
//!   and zstd pages only, the codecs compiled in).
//! - `text`: every `.txt` file of a folder is one document, id = the path.
//! - `html`: every `.html`/`.htm` file is one HTML document for the `extract` stage (decoded
//!   lossily: pages use many charsets and extraction only needs the text).
//! - `warc`: `response`/`resource` records of `.warc` or `.warc.gz` files whose media type is HTML
//!   or plain text; id = WARC-Record-ID, URL = WARC-Target-URI.
//!
//! Directories are walked recursively and files taken in sorted order, so runs are repeatable.
//! Bad input (unreadable file, corrupt Parquet, malformed JSON line, invalid UTF-8, missing or
//! non-string text field) becomes a [`BadRecord`] naming `file:line` (or `file: row N`).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::document::{ContentType, Document, Metadata};
use super::warc::WarcReader;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    Jsonl,
    Parquet,
    Text,
    Html,
    Warc,
}

impl InputFormat {
    fn accepts(&self, path: &Path) -> bool {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        let ends = |suffixes: &[&str]| suffixes.iter().any(|s| name.ends_with(s));
        match self {
            InputFormat::Jsonl => ends(&[".jsonl", ".jsonl.zst", ".json", ".ndjson"]),
            InputFormat::Parquet => ends(&[".parquet"]),
            InputFormat::Text => ends(&[".txt"]),
            InputFormat::Html => ends(&[".html", ".htm"]),
            InputFormat::Warc => ends(&[".warc", ".warc.gz"]),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFile {
    pub name: String,
    pub paths: Vec<PathBuf>,
    pub format: InputFormat,
    #[serde(default = "default_text_field")]
    pub text_field: String,
    #[serde(default = "default_id_field")]
    pub id_field: String,
    #[serde(default = "default_url_field")]
    pub url_field: String,
}

fn default_text_field() -> String {
    "text".into()
}
fn default_id_field() -> String {
    "id".into()
}
fn default_url_field() -> String {
    "url".into()
}

/// A validated source: its files listed and sorted.
#[derive(Clone, Debug)]
pub struct Source {
    pub name: String,
    pub files: Vec<PathBuf>,
    pub format: InputFormat,
    pub text_field: String,
    pub id_field: String,
    pub url_field: String,
}

/// Input that could not become a document, with where it is.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BadRecord {
    pub location: String,
    pub error: String,
}

#[derive(Debug)]
pub enum ReadItem {
    Document(Document),
    Bad(BadRecord),
}

fn walk(path: &Path, format: InputFormat, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("input path {}: {e}", path.display()))?;
    if meta.is_file() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let entries =
        std::fs::read_dir(path).map_err(|e| format!("input folder {}: {e}", path.display()))?;
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    children.sort();
    for child in children {
        if child.is_dir() {
            walk(&child, format, out)?;
        } else if format.accepts(&child) {
            out.push(child);
        }
    }
    Ok(())
}

impl SourceFile {
    /// Lists the files; relative paths are taken from `base_dir` (the config file's folder).
    pub fn validate(self, base_dir: &Path) -> Result<Source, String> {
        if self.name.is_empty() || self.name.contains(['/', '\\']) {
            return Err(format!(
                "source name {:?} must be non-empty and contain no slash",
                self.name
            ));
        }
        if self.paths.is_empty() {
            return Err(format!("source {:?} lists no paths", self.name));
        }
        let mut files = Vec::new();
        for path in &self.paths {
            walk(&base_dir.join(path), self.format, &mut files)
                .map_err(|e| format!("source {:?}: {e}", self.name))?;
        }
        Ok(Source {
            name: self.name,
            files,
            format: self.format,
            text_field: self.text_field,
            id_field: self.id_field,
            url_field: self.url_field,
        })
    }
}

type Items = Box<dyn Iterator<Item = ReadItem> + Send>;

fn bad(location: String, error: impl std::fmt::Display) -> ReadItem {
    ReadItem::Bad(BadRecord {
        location,
        error: error.to_string(),
    })
}

/// Streams the documents of one source, file after file.
pub struct SourceReader {
    source: Source,
    next_file: usize,
    current: Option<Items>,
}

impl SourceReader {
    pub fn new(source: Source) -> Self {
        SourceReader {
            source,
            next_file: 0,
            current: None,
        }
    }

    fn open(&self, path: &Path) -> Items {
        let shown = path.display().to_string();
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) => return Box::new(std::iter::once(bad(shown, format!("cannot open: {e}")))),
        };
        let s = &self.source;
        match s.format {
            InputFormat::Jsonl => {
                let reader: Box<dyn BufRead + Send> = if shown.ends_with(".zst") {
                    match zstd::Decoder::new(file) {
                        Ok(d) => Box::new(BufReader::with_capacity(1 << 20, d)),
                        Err(e) => {
                            return Box::new(std::iter::once(bad(shown, format!("zstd: {e}"))));
                        }
                    }
                } else {
                    Box::new(BufReader::with_capacity(1 << 20, file))
                };
                Box::new(JsonlItems {
                    reader,
                    path: shown,
                    line: 0,
                    source: s.clone(),
                    done: false,
                })
            }
            InputFormat::Parquet => parquet_items(file, shown, s.clone()),
            InputFormat::Text | InputFormat::Html => {
                let mut bytes = Vec::new();
                if let Err(e) = BufReader::new(file).read_to_end(&mut bytes) {
                    return Box::new(std::iter::once(bad(shown, format!("cannot read: {e}"))));
                }
                let (text, content_type) = if s.format == InputFormat::Html {
                    (
                        String::from_utf8_lossy(&bytes).into_owned(),
                        ContentType::Html,
                    )
                } else {
                    match String::from_utf8(bytes) {
                        Ok(t) => (t, ContentType::Plain),
                        Err(e) => {
                            return Box::new(std::iter::once(bad(
                                shown,
                                format!("invalid UTF-8: {e}"),
                            )));
                        }
                    }
                };
                let mut doc = Document::plain(shown, text, s.name.clone());
                doc.metadata.content_type = content_type;
                Box::new(std::iter::once(ReadItem::Document(doc)))
            }
            InputFormat::Warc => {
                let reader: Box<dyn BufRead + Send> = if shown.ends_with(".gz") {
                    Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(file)))
                } else {
                    Box::new(BufReader::new(file))
                };
                Box::new(WarcItems {
                    reader: WarcReader::new(reader),
                    path: shown,
                    source: s.name.clone(),
                    done: false,
                })
            }
        }
    }
}

impl Iterator for SourceReader {
    type Item = ReadItem;

    fn next(&mut self) -> Option<ReadItem> {
        loop {
            if let Some(items) = &mut self.current {
                if let Some(item) = items.next() {
                    return Some(item);
                }
                self.current = None;
            }
            let path = self.source.files.get(self.next_file)?.clone();
            self.next_file += 1;
            self.current = Some(self.open(&path));
        }
    }
}

/// Builds a document from a JSON object, moving uninterpreted fields into metadata.
fn document_from_object(
    mut object: serde_json::Map<String, serde_json::Value>,
    source: &Source,
    location: &str,
) -> Result<Document, String> {
    let text = match object.remove(&source.text_field) {
        Some(serde_json::Value::String(t)) => t,
        Some(other) => {
            return Err(format!(
                "field {:?} is not a string but {}",
                source.text_field,
                kind(&other)
            ));
        }
        None => return Err(format!("missing field {:?}", source.text_field)),
    };
    let id = match object.remove(&source.id_field) {
        Some(serde_json::Value::String(s)) => s,
        Some(serde_json::Value::Number(n)) => n.to_string(),
        _ => location.to_string(),
    };
    let url = match object.remove(&source.url_field) {
        Some(serde_json::Value::String(s)) => Some(s),
        _ => None,
    };
    Ok(Document {
        id,
        text,
        source: source.name.clone(),
        metadata: Metadata {
            url,
            extra: object,
            ..Metadata::default()
        },
    })
}

fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

struct JsonlItems {
    reader: Box<dyn BufRead + Send>,
    path: String,
    line: u64,
    source: Source,
    done: bool,
}

impl Iterator for JsonlItems {
    type Item = ReadItem;

    fn next(&mut self) -> Option<ReadItem> {
        let mut buf = Vec::new();
        loop {
            if self.done {
                return None;
            }
            buf.clear();
            self.line += 1;
            let location = format!("{}:{}", self.path, self.line);
            match self.reader.read_until(b'\n', &mut buf) {
                Ok(0) => {
                    self.done = true;
                    return None;
                }
                Ok(_) => {}
                Err(e) => {
                    self.done = true;
                    return Some(bad(location, format!("read error: {e}")));
                }
            }
            let line = match std::str::from_utf8(&buf) {
                Ok(l) => l.trim(),
                Err(e) => return Some(bad(location, format!("invalid UTF-8: {e}"))),
            };
            if line.is_empty() {
                continue;
            }
            let object: serde_json::Map<String, serde_json::Value> =
                match serde_json::from_str(line) {
                    Ok(o) => o,
                    Err(e) => return Some(bad(location, format!("malformed JSON: {e}"))),
                };
            return Some(
                match document_from_object(object, &self.source, &location) {
                    Ok(doc) => ReadItem::Document(doc),
                    Err(e) => bad(location, e),
                },
            );
        }
    }
}

fn parquet_items(file: File, path: String, source: Source) -> Items {
    use parquet::file::reader::SerializedFileReader;
    use parquet::record::Field;
    let reader = match SerializedFileReader::new(file) {
        Ok(r) => r,
        Err(e) => return Box::new(std::iter::once(bad(path, format!("corrupt Parquet: {e}")))),
    };
    let mut row_number = 0u64;
    let mut failed = false;
    Box::new(reader.into_iter().map_while(move |row| {
        if failed {
            return None;
        }
        row_number += 1;
        let location = format!("{path}: row {row_number}");
        let row = match row {
            Ok(r) => r,
            Err(e) => {
                failed = true; // the row iterator cannot resume past a broken page
                return Some(bad(location, format!("corrupt Parquet: {e}")));
            }
        };
        let mut object = serde_json::Map::new();
        for (name, field) in row.into_columns() {
            let value = match field {
                Field::Str(s) => serde_json::Value::String(s),
                Field::Null => serde_json::Value::Null,
                Field::Bool(b) => serde_json::Value::Bool(b),
                Field::Int(v) => v.into(),
                Field::Long(v) => v.into(),
                Field::Double(v) => v.into(),
                other => serde_json::Value::String(other.to_string()),
            };
            object.insert(name, value);
        }
        Some(match document_from_object(object, &source, &location) {
            Ok(doc) => ReadItem::Document(doc),
            Err(e) => bad(location, e),
        })
    }))
}

struct WarcItems {
    reader: WarcReader<Box<dyn BufRead + Send>>,
    path: String,
    source: String,
    done: bool,
}

impl Iterator for WarcItems {
    type Item = ReadItem;

    fn next(&mut self) -> Option<ReadItem> {
        loop {
            if self.done {
                return None;
            }
            match self.reader.next_record() {
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    return Some(bad(format!("{}: {e}", self.path), "malformed WARC record"));
                }
                Ok(Some(record)) => {
                    let content_type = if record.media_type.contains("html") {
                        ContentType::Html
                    } else if record.media_type.starts_with("text/plain") {
                        ContentType::Plain
                    } else {
                        continue;
                    };
                    let mut doc =
                        Document::plain(record.record_id, record.payload, self.source.clone());
                    doc.metadata.url = record.target_uri;
                    doc.metadata.content_type = content_type;
                    return Some(ReadItem::Document(doc));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(dir: &Path, format: InputFormat) -> Source {
        SourceFile {
            name: "src".into(),
            paths: vec![dir.to_path_buf()],
            format,
            text_field: "text".into(),
            id_field: "id".into(),
            url_field: "url".into(),
        }
        .validate(Path::new("/"))
        .unwrap()
    }

    #[test]
    fn jsonl_bad_lines_are_reported_with_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        let mut bytes = b"{\"id\": \"x\", \"text\": \"hello\", \"lang\": \"en\"}\n{not json}\n{\"body\": \"no text\"}\n".to_vec();
        bytes.extend_from_slice(b"{\"text\": \"\xff\xfe\"}\n\n{\"text\": 5}\n{\"text\": \"last\", \"url\": \"http://a.b/\"}\n");
        std::fs::write(&path, bytes).unwrap();
        let items: Vec<ReadItem> =
            SourceReader::new(source(dir.path(), InputFormat::Jsonl)).collect();
        let mut docs = Vec::new();
        let mut bad_records = Vec::new();
        for item in items {
            match item {
                ReadItem::Document(d) => docs.push(d),
                ReadItem::Bad(b) => bad_records.push(b),
            }
        }
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].id, "x");
        assert_eq!(
            docs[0].metadata.extra.get("lang"),
            Some(&serde_json::json!("en"))
        );
        assert_eq!(docs[1].metadata.url.as_deref(), Some("http://a.b/"));
        let shown = path.display().to_string();
        assert_eq!(docs[1].id, format!("{shown}:7"));
        let locations: Vec<&str> = bad_records.iter().map(|b| b.location.as_str()).collect();
        assert_eq!(
            locations,
            vec![
                format!("{shown}:2"),
                format!("{shown}:3"),
                format!("{shown}:4"),
                format!("{shown}:6")
            ]
        );
        assert!(bad_records[1].error.contains("missing field \"text\""));
        assert!(bad_records[2].error.contains("UTF-8"));
        assert!(bad_records[3].error.contains("not a string"));
    }

    #[test]
    fn zstd_jsonl_and_text_folders_are_read_in_sorted_order() {
        let dir = tempfile::tempdir().unwrap();
        let zst = zstd::encode_all(&b"{\"text\": \"compressed\"}\n"[..], 3).unwrap();
        std::fs::write(dir.path().join("b.jsonl.zst"), zst).unwrap();
        let docs: Vec<ReadItem> =
            SourceReader::new(source(dir.path(), InputFormat::Jsonl)).collect();
        assert!(matches!(&docs[0], ReadItem::Document(d) if d.text == "compressed"));
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/2.txt"), "two").unwrap();
        std::fs::write(dir.path().join("1.txt"), "one").unwrap();
        std::fs::write(dir.path().join("3.txt"), [0xffu8, 0x00]).unwrap();
        let items: Vec<ReadItem> =
            SourceReader::new(source(dir.path(), InputFormat::Text)).collect();
        let summary: Vec<String> = items
            .iter()
            .map(|i| match i {
                ReadItem::Document(d) => d.text.clone(),
                ReadItem::Bad(b) => format!("bad {}", b.location.ends_with("3.txt")),
            })
            .collect();
        assert_eq!(summary, vec!["one", "bad true", "two"]);
    }

    #[test]
    fn unreadable_file_is_a_bad_record_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.jsonl"), "{\"text\": \"fine\"}\n").unwrap();
        std::os::unix::fs::symlink(dir.path().join("missing"), dir.path().join("b.jsonl")).unwrap();
        let items: Vec<ReadItem> =
            SourceReader::new(source(dir.path(), InputFormat::Jsonl)).collect();
        assert_eq!(items.len(), 2);
        assert!(matches!(&items[0], ReadItem::Document(d) if d.text == "fine"));
        assert!(
            matches!(&items[1], ReadItem::Bad(b) if b.location.ends_with("b.jsonl") && b.error.contains("cannot open"))
        );
    }

    #[test]
    fn corrupt_parquet_is_a_bad_record_not_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x.parquet"), b"PAR1 this is not parquet").unwrap();
        let items: Vec<ReadItem> =
            SourceReader::new(source(dir.path(), InputFormat::Parquet)).collect();
        assert_eq!(items.len(), 1);
        assert!(matches!(&items[0], ReadItem::Bad(b) if b.error.contains("corrupt Parquet")));
    }
}
