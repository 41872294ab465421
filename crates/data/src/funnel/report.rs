//! The funnel report: what every stage took in, let out and removed (documents, bytes, reason),
//! the bad input with its locations, and samples of removed documents per reason.
//!
//! Written by [`FunnelReport::write`] as `report.json`, `funnel.svg` (documents kept after each
//! stage, a waterfall of bars) and `removed/<reason>.jsonl` (a reservoir sample of at most
//! `removed_samples` documents per reason, seeded, so the same run keeps the same samples).
//!
//! Why no plotting crate: the chart is bars and labels; `plotters` without a font backend cannot
//! measure text, and with one it pulls a TrueType stack. Hand-written SVG is 60 lines.

use std::collections::BTreeMap;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::document::{Document, DropReason, Event};
use super::input::BadRecord;

/// How many bad records the report lists in full (all are counted).
pub const MAX_LISTED_BAD_RECORDS: usize = 100;

#[derive(Clone, Debug, Default, Serialize)]
pub struct StageReport {
    pub name: String,
    pub documents_in: u64,
    pub documents_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub removed: BTreeMap<String, u64>,
    pub events: BTreeMap<String, u64>,
    /// Time spent in this stage summed over threads (parallel work counts once per thread).
    pub cpu_seconds: f64,
}

impl StageReport {
    pub fn new(name: &str) -> Self {
        StageReport {
            name: name.to_string(),
            ..Default::default()
        }
    }

    pub fn record_kept(&mut self, bytes_in: u64, bytes_out: u64) {
        self.documents_in += 1;
        self.documents_out += 1;
        self.bytes_in += bytes_in;
        self.bytes_out += bytes_out;
    }

    pub fn record_removed(&mut self, bytes_in: u64, reason: DropReason) {
        self.documents_in += 1;
        self.bytes_in += bytes_in;
        *self.removed.entry(reason.name()).or_default() += 1;
    }

    pub fn record_events(&mut self, events: &[(Event, u64)]) {
        for (event, count) in events {
            *self.events.entry(event.name().to_string()).or_default() += count;
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct InputReport {
    pub files: u64,
    pub documents: u64,
    pub bytes: u64,
    pub bad_records: u64,
    /// The first [`MAX_LISTED_BAD_RECORDS`] bad records.
    pub bad_record_examples: Vec<BadRecord>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct OutputReport {
    pub path: String,
    pub documents: u64,
    pub bytes: u64,
    /// Documents kept per source before the mixture (equal to the output without one).
    pub kept_per_source: BTreeMap<String, u64>,
    /// Documents per source in the output after the mixture's epochs.
    pub written_per_source: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct FunnelReport {
    pub input: InputReport,
    pub stages: Vec<StageReport>,
    pub output: OutputReport,
    /// Clusters with at least one removed near-duplicate (MinHash stage), if present.
    pub near_duplicate_clusters: Option<u64>,
    /// Fingerprints loaded from an earlier run's exact-dedup state, if any.
    pub exact_fingerprints_loaded: Option<u64>,
    /// Token shards written by the `[tokenize]` step, if configured.
    pub tokenized: Option<super::tokenize::TokenizeReport>,
    pub threads: usize,
    pub wall_seconds: f64,
    pub documents_per_second: f64,
    pub megabytes_per_second: f64,
}

/// Reservoir samples of removed documents, one reservoir per reason (Vitter's algorithm R).
#[derive(Debug)]
pub struct RemovedSamples {
    capacity: usize,
    rng: ChaCha8Rng,
    reservoirs: BTreeMap<DropReason, (u64, Vec<RemovedSample>)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RemovedSample {
    pub stage: String,
    pub reason: String,
    #[serde(flatten)]
    pub document: Document,
}

impl RemovedSamples {
    pub fn new(capacity: usize, seed: u64) -> Self {
        RemovedSamples {
            capacity,
            rng: ChaCha8Rng::seed_from_u64(seed),
            reservoirs: BTreeMap::new(),
        }
    }

    pub fn offer(&mut self, stage: &str, reason: DropReason, document: Document) {
        if self.capacity == 0 {
            return;
        }
        let (seen, items) = self.reservoirs.entry(reason).or_default();
        *seen += 1;
        let sample = || RemovedSample {
            stage: stage.to_string(),
            reason: reason.name(),
            document,
        };
        if items.len() < self.capacity {
            items.push(sample());
        } else {
            let slot = self.rng.random_range(0..*seen);
            if (slot as usize) < self.capacity {
                items[slot as usize] = sample();
            }
        }
    }

    pub fn write(&self, dir: &Path) -> Result<(), String> {
        let removed = dir.join("removed");
        std::fs::create_dir_all(&removed)
            .map_err(|e| format!("cannot create {}: {e}", removed.display()))?;
        for (reason, (_, items)) in &self.reservoirs {
            let path = removed.join(format!("{}.jsonl", reason.name()));
            let mut out = Vec::new();
            for item in items {
                serde_json::to_writer(&mut out, item).map_err(|e| e.to_string())?;
                out.push(b'\n');
            }
            std::fs::write(&path, out)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        Ok(())
    }
}

impl FunnelReport {
    pub fn write(&self, dir: &Path, samples: &RemovedSamples) -> Result<(), String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let json = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        let path = dir.join("report.json");
        std::fs::write(&path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let path = dir.join("funnel.svg");
        std::fs::write(&path, self.svg())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        samples.write(dir)
    }

    /// A waterfall chart: one bar per step (input, then each stage) of the documents remaining.
    pub fn svg(&self) -> String {
        let mut bars: Vec<(String, u64)> = vec![("input".to_string(), self.input.documents)];
        bars.extend(
            self.stages
                .iter()
                .map(|s| (s.name.clone(), s.documents_out)),
        );
        let max = bars.iter().map(|(_, v)| *v).max().unwrap_or(0).max(1) as f64;
        let (bar_w, gap, left, top, plot_h) = (70.0, 20.0, 60.0, 40.0, 300.0);
        let width = left + bars.len() as f64 * (bar_w + gap) + 20.0;
        let height = top + plot_h + 130.0;
        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
        );
        let _ = write!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = write!(
            svg,
            r#"<text x="{left}" y="24" font-size="16">Documents kept per stage</text>"#
        );
        let axis_y = top + plot_h;
        let _ = write!(
            svg,
            r##"<line x1="{left}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="#333"/>"##,
            width - 10.0
        );
        let mut previous = self.input.documents;
        for (i, (name, value)) in bars.iter().enumerate() {
            let x = left + gap / 2.0 + i as f64 * (bar_w + gap);
            let h = *value as f64 / max * plot_h;
            let y = axis_y - h;
            let removed = previous.saturating_sub(*value) as f64 / max * plot_h;
            let _ = write!(
                svg,
                r##"<rect x="{x}" y="{y}" width="{bar_w}" height="{h}" fill="#4a7ab5"/>"##
            );
            if i > 0 && removed > 0.0 {
                let _ = write!(
                    svg,
                    r##"<rect x="{x}" y="{}" width="{bar_w}" height="{removed}" fill="#e8a09a"/>"##,
                    y - removed
                );
            }
            let pct = 100.0 * *value as f64 / self.input.documents.max(1) as f64;
            let _ = write!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="middle">{value} ({pct:.1}%)</text>"#,
                x + bar_w / 2.0,
                y - removed - 4.0
            );
            let _ = write!(
                svg,
                r#"<text transform="translate({},{}) rotate(45)">{}</text>"#,
                x + bar_w / 2.0,
                axis_y + 14.0,
                escape(name)
            );
            previous = *value;
        }
        svg.push_str("</svg>\n");
        svg
    }
}

use std::fmt::Write as _;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservoir_keeps_at_most_capacity_and_is_seeded() {
        let run = |seed| {
            let mut samples = RemovedSamples::new(3, seed);
            for i in 0..100 {
                samples.offer(
                    "s",
                    DropReason::GopherShortDoc,
                    Document::plain(i.to_string(), "t", "src"),
                );
            }
            let (seen, items) = &samples.reservoirs[&DropReason::GopherShortDoc];
            assert_eq!(*seen, 100);
            assert_eq!(items.len(), 3);
            items
                .iter()
                .map(|s| s.document.id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(
            run(1),
            vec!["0", "1", "2"],
            "later documents must get a chance"
        );
    }

    #[test]
    fn svg_has_one_bar_per_stage_and_input() {
        let mut report = FunnelReport::default();
        report.input.documents = 10;
        for (name, out) in [("a", 8), ("b<x>", 5)] {
            let mut s = StageReport::new(name);
            s.documents_out = out;
            report.stages.push(s);
        }
        let svg = report.svg();
        assert_eq!(svg.matches("fill=\"#4a7ab5\"").count(), 3);
        assert!(svg.contains("5 (50.0%)") && svg.contains("b&lt;x&gt;"));
    }
}
