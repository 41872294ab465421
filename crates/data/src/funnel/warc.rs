//! A small WARC 1.0/1.1 reader: yields the HTTP payload of `response` records (and the body of
//! `resource` records) with their record id, target URI and media type. Other record types
//! (`warcinfo`, `request`, `metadata`, ...) are skipped.
//!
//! Why hand-written: the format is a version line, `Name: value` headers, a blank line and
//! `Content-Length` bytes; the `warc` crate adds little over these 150 lines and has been quiet
//! for years. Gzip-compressed files (`.warc.gz`, one gzip member per record) are read through
//! `flate2`'s multi-member decoder.
//!
//! Invariant: a record whose header block is malformed ends the file with an error (the reader
//! cannot find the next record boundary); a payload that is not UTF-8 is decoded lossily, since
//! web pages declare many charsets and the extraction stage only needs the text.

use std::io::{BufRead, Read};

/// One content record.
#[derive(Clone, Debug, PartialEq)]
pub struct WarcRecord {
    pub record_id: String,
    pub target_uri: Option<String>,
    /// The payload's media type (`text/html`, ...), from the HTTP header of a response.
    pub media_type: String,
    pub payload: String,
}

pub struct WarcReader<R: BufRead> {
    input: R,
    /// Bytes consumed so far, for error locations.
    offset: u64,
}

impl<R: BufRead> WarcReader<R> {
    pub fn new(input: R) -> Self {
        WarcReader { input, offset: 0 }
    }

    fn read_line(&mut self) -> std::io::Result<Option<String>> {
        let mut line = Vec::new();
        let n = self.input.read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(None);
        }
        self.offset += n as u64;
        Ok(Some(
            String::from_utf8_lossy(&line)
                .trim_end_matches(['\r', '\n'])
                .to_string(),
        ))
    }

    /// The next content record, `Ok(None)` at the end of the input.
    pub fn next_record(&mut self) -> Result<Option<WarcRecord>, String> {
        loop {
            let at = self.offset;
            let version = loop {
                match self.read_line().map_err(|e| format!("byte {at}: {e}"))? {
                    None => return Ok(None),
                    Some(line) if line.is_empty() => continue,
                    Some(line) => break line,
                }
            };
            if !version.starts_with("WARC/") {
                return Err(format!(
                    "byte {at}: expected a WARC version line, found {version:?}"
                ));
            }
            let mut headers: Vec<(String, String)> = Vec::new();
            loop {
                match self.read_line().map_err(|e| format!("byte {at}: {e}"))? {
                    None => {
                        return Err(format!(
                            "byte {at}: record header ends without a blank line"
                        ));
                    }
                    Some(line) if line.is_empty() => break,
                    Some(line) => {
                        if let Some((name, value)) = line.split_once(':') {
                            headers
                                .push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
                        }
                    }
                }
            }
            let header = |name: &str| {
                headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            let length: u64 = header("content-length")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("byte {at}: record without a valid Content-Length"))?;
            let mut body = Vec::with_capacity(length.min(1 << 26) as usize);
            (&mut self.input)
                .take(length)
                .read_to_end(&mut body)
                .map_err(|e| format!("byte {at}: {e}"))?;
            if (body.len() as u64) < length {
                return Err(format!(
                    "byte {at}: record body truncated ({} of {length} bytes)",
                    body.len()
                ));
            }
            self.offset += length;
            let kind = header("warc-type").unwrap_or_default();
            let record_id = header("warc-record-id").unwrap_or_else(|| format!("byte-{at}"));
            let target_uri = header("warc-target-uri");
            let record = match kind.as_str() {
                "response" => split_http_response(&body).map(|(media_type, payload)| WarcRecord {
                    record_id,
                    target_uri,
                    media_type,
                    payload: String::from_utf8_lossy(payload).into_owned(),
                }),
                "resource" => Some(WarcRecord {
                    record_id,
                    target_uri,
                    media_type: header("content-type").unwrap_or_default(),
                    payload: String::from_utf8_lossy(&body).into_owned(),
                }),
                _ => None,
            };
            if let Some(record) = record {
                return Ok(Some(record));
            }
        }
    }
}

/// Splits an HTTP response into (media type, payload); `None` when there is no header end.
fn split_http_response(body: &[u8]) -> Option<(String, &[u8])> {
    let end = body
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            body.windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        })?;
    let head = String::from_utf8_lossy(&body[..end.0]);
    let media_type = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| {
            value
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    Some((media_type, &body[end.1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn record(kind: &str, id: &str, uri: &str, block: &str) -> String {
        format!(
            "WARC/1.0\r\nWARC-Type: {kind}\r\nWARC-Record-ID: {id}\r\nWARC-Target-URI: {uri}\r\n\
             Content-Length: {}\r\n\r\n{block}\r\n\r\n",
            block.len()
        )
    }

    #[test]
    fn reads_response_payloads_and_skips_other_records() {
        let http = "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<p>hello</p>";
        let input = record("warcinfo", "<urn:1>", "", "software: test")
            + &record(
                "request",
                "<urn:2>",
                "http://a.example/",
                "GET / HTTP/1.1\r\n\r\n",
            )
            + &record("response", "<urn:3>", "http://a.example/", http);
        let mut reader = WarcReader::new(input.as_bytes());
        let rec = reader.next_record().unwrap().unwrap();
        assert_eq!(rec.record_id, "<urn:3>");
        assert_eq!(rec.target_uri.as_deref(), Some("http://a.example/"));
        assert_eq!(rec.media_type, "text/html");
        assert_eq!(rec.payload, "<p>hello</p>");
        assert_eq!(reader.next_record().unwrap(), None);
    }

    #[test]
    fn truncated_record_is_an_error_with_offset() {
        let input = "WARC/1.0\r\nWARC-Type: response\r\nContent-Length: 100\r\n\r\nshort";
        let err = WarcReader::new(input.as_bytes()).next_record().unwrap_err();
        assert!(err.contains("byte 0") && err.contains("truncated"), "{err}");
    }
}
