//! Line- and paragraph-level deduplication across the corpus: a unit (line, paragraph, or
//! FineWeb/datatrove-style span of 3 consecutive lines) whose hash was seen in an earlier
//! document is cut from the text. This removes cookie banners, navigation residue, licence
//! headers and other boilerplate repeated across pages without dropping the pages.
//!
//! Rules: units are compared after trimming; units shorter than `min_chars` are never hashed or
//! removed (short lines such as "Exit." or "1." carry no boilerplate signal); repeats inside the
//! same document are left to the Gopher repetition filter, only earlier documents count. A
//! document left with no text is removed (`line_dedup_emptied`).
//! Hashes are computed in parallel ([`LineDedup::unit_hashes`]), decisions made in order.

use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

use super::document::{Document, DropReason, Event, Events, Verdict};
use super::text::PrehashedSet;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DedupUnit {
    #[default]
    Line,
    Paragraph,
    /// Spans of 3 consecutive non-short lines; every line of a seen span is removed.
    ThreeLineSpan,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LineDedupFile {
    pub unit: DedupUnit,
    pub min_chars: usize,
}

impl Default for LineDedupFile {
    fn default() -> Self {
        LineDedupFile {
            unit: DedupUnit::Line,
            min_chars: 10,
        }
    }
}

#[derive(Debug)]
pub struct LineDedup {
    unit: DedupUnit,
    min_chars: usize,
    seen: PrehashedSet,
}

impl LineDedupFile {
    pub fn validate(self) -> Result<LineDedup, String> {
        Ok(LineDedup {
            unit: self.unit,
            min_chars: self.min_chars,
            seen: PrehashedSet::default(),
        })
    }
}

/// The hashes of one document's units, in order; `None` for units too short to count.
#[derive(Debug, Default)]
pub struct UnitHashes {
    units: Vec<Option<u64>>,
    /// For `ThreeLineSpan`: the hash of the span starting at each eligible line.
    spans: Vec<(usize, u64)>,
}

impl LineDedup {
    fn separator(&self) -> &'static str {
        match self.unit {
            DedupUnit::Paragraph => "\n\n",
            DedupUnit::Line | DedupUnit::ThreeLineSpan => "\n",
        }
    }

    fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        match self.unit {
            DedupUnit::Paragraph => text.split("\n\n").collect(),
            DedupUnit::Line | DedupUnit::ThreeLineSpan => text.split('\n').collect(),
        }
    }

    pub fn unit_hashes(&self, text: &str) -> UnitHashes {
        let units: Vec<Option<u64>> = self
            .split(text)
            .iter()
            .map(|u| {
                let t = u.trim();
                (t.chars().count() >= self.min_chars.max(1)).then(|| xxh3_64(t.as_bytes()))
            })
            .collect();
        let mut spans = Vec::new();
        if self.unit == DedupUnit::ThreeLineSpan {
            let eligible: Vec<(usize, u64)> = units
                .iter()
                .enumerate()
                .filter_map(|(i, h)| h.map(|h| (i, h)))
                .collect();
            for window in eligible.windows(3) {
                let bytes: Vec<u8> = window.iter().flat_map(|(_, h)| h.to_le_bytes()).collect();
                spans.push((window[0].0, xxh3_64(&bytes)));
            }
        }
        UnitHashes { units, spans }
    }

    pub fn decide(
        &mut self,
        mut doc: Document,
        hashes: UnitHashes,
        events: &mut Events,
    ) -> Verdict {
        let pieces = self.split(&doc.text);
        let mut removed = vec![false; pieces.len()];
        match self.unit {
            DedupUnit::Line | DedupUnit::Paragraph => {
                for (i, h) in hashes.units.iter().enumerate() {
                    if let Some(h) = h
                        && self.seen.contains(h)
                    {
                        removed[i] = true;
                    }
                }
                self.seen.extend(hashes.units.iter().flatten());
            }
            DedupUnit::ThreeLineSpan => {
                let eligible: Vec<usize> = hashes
                    .units
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| h.is_some())
                    .map(|(i, _)| i)
                    .collect();
                for (k, &(_, span)) in hashes.spans.iter().enumerate() {
                    if self.seen.contains(&span) {
                        for &line in &eligible[k..k + 3] {
                            removed[line] = true;
                        }
                    }
                }
                self.seen.extend(hashes.spans.iter().map(|(_, h)| *h));
            }
        }
        let count = removed.iter().filter(|&&r| r).count() as u64;
        if count == 0 {
            return Verdict::Keep(doc);
        }
        let kept: Vec<&str> = pieces
            .iter()
            .zip(&removed)
            .filter(|(_, r)| !**r)
            .map(|(p, _)| *p)
            .collect();
        let text = kept.join(self.separator());
        events.push((Event::UnitsRemoved, count));
        events.push((Event::DocumentModified, 1));
        doc.text = text;
        if doc.text.trim().is_empty() {
            return Verdict::Drop(doc, DropReason::LineDedupEmptied);
        }
        Verdict::Keep(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dedup: &mut LineDedup, text: &str) -> Result<String, DropReason> {
        let hashes = dedup.unit_hashes(text);
        match dedup.decide(Document::plain("d", text, "s"), hashes, &mut Vec::new()) {
            Verdict::Keep(doc) => Ok(doc.text),
            Verdict::Drop(_, reason) => Err(reason),
        }
    }

    #[test]
    fn lines_seen_in_earlier_documents_are_removed() {
        let mut dedup = LineDedupFile::default().validate().unwrap();
        let banner = "This website uses cookies to improve things.";
        assert_eq!(
            run(&mut dedup, &format!("First article body text.\n{banner}"))
                .unwrap()
                .lines()
                .count(),
            2
        );
        assert_eq!(
            run(&mut dedup, &format!("{banner}\nSecond article body text.")),
            Ok("Second article body text.".into())
        );
    }

    #[test]
    fn short_lines_and_in_document_repeats_stay() {
        let mut dedup = LineDedupFile::default().validate().unwrap();
        let text = "Exit.\nA line long enough to count.\nA line long enough to count.";
        assert_eq!(run(&mut dedup, text), Ok(text.into()));
        assert_eq!(
            run(&mut dedup, "Exit.\nsomething else entirely."),
            Ok("Exit.\nsomething else entirely.".into())
        );
    }

    #[test]
    fn fully_duplicated_document_is_removed() {
        let mut dedup = LineDedupFile {
            unit: DedupUnit::Paragraph,
            min_chars: 5,
        }
        .validate()
        .unwrap();
        let text = "first paragraph here\n\nsecond paragraph here";
        assert!(run(&mut dedup, text).is_ok());
        assert_eq!(run(&mut dedup, text), Err(DropReason::LineDedupEmptied));
    }

    #[test]
    fn three_line_spans_need_all_three_lines() {
        let mut dedup = LineDedupFile {
            unit: DedupUnit::ThreeLineSpan,
            min_chars: 3,
        }
        .validate()
        .unwrap();
        assert!(run(&mut dedup, "line aaa\nline bbb\nline ccc\nline ddd").is_ok());
        // Two of the three lines match: nothing removed.
        assert_eq!(
            run(&mut dedup, "line aaa\nline bbb\nline zzz"),
            Ok("line aaa\nline bbb\nline zzz".into())
        );
        assert_eq!(
            run(&mut dedup, "new one\nline bbb\nline ccc\nline ddd"),
            Ok("new one".into())
        );
    }
}
