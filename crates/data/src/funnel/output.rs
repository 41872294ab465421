//! The output file: kept documents as JSONL, one [`Document`] per line, zstd-compressed when the
//! path ends in `.zst`. Counts what it wrote (documents, text bytes) for the report.
//!
//! What it is not: a shard writer; token shards come from [`super::tokenize`].

use std::io::Write;
use std::path::Path;

use super::document::Document;

/// Writes kept documents as JSONL, zstd-compressed when the path ends in `.zst`.
pub struct JsonlWriter {
    out: Box<dyn Write + Send>,
    pub documents: u64,
    pub bytes: u64,
    path: String,
}

impl JsonlWriter {
    pub fn create(path: &Path) -> Result<Self, String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let file = std::fs::File::create(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let buffered = std::io::BufWriter::with_capacity(1 << 20, file);
        let out: Box<dyn Write + Send> = if path.extension().is_some_and(|e| e == "zst") {
            let encoder = zstd::Encoder::new(buffered, 3).map_err(|e| format!("zstd: {e}"))?;
            Box::new(encoder.auto_finish())
        } else {
            Box::new(buffered)
        };
        Ok(JsonlWriter {
            out,
            documents: 0,
            bytes: 0,
            path: path.display().to_string(),
        })
    }

    pub fn write(&mut self, doc: &Document) -> Result<(), String> {
        serde_json::to_writer(&mut self.out, doc).map_err(|e| format!("{}: {e}", self.path))?;
        self.out
            .write_all(b"\n")
            .map_err(|e| format!("{}: {e}", self.path))?;
        self.documents += 1;
        self.bytes += doc.byte_len();
        Ok(())
    }

    pub fn finish(mut self) -> Result<(), String> {
        self.out.flush().map_err(|e| format!("{}: {e}", self.path))
    }
}
