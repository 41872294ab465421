//! The run: reads sources in chunks, sends each chunk through the stages, writes what is kept,
//! counts everything, and writes the report. Reads top to bottom as the algorithm:
//!
//! 1. for each source, for each chunk of `chunk_size` documents (bad records counted aside):
//!    a. per-document stages run in parallel over the chunk (rayon, order preserved), together
//!    with the parallel half of the next ordered stage (fingerprints, signatures, hashes);
//!    b. that ordered stage decides document by document in reading order;
//!    c. repeat from (a) with the stages after it; write the survivors.
//! 2. stages finish (dedup state persisted);
//! 3. with a `[mixture]`, the per-source spools are blended into the output;
//! 4. with a `[tokenize]` table, the output becomes token shards;
//! 5. report.json, funnel.svg and removed samples are written.
//!
//! What it is not: distributed. One process, all cores; dedup state lives in memory.

use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;

use super::FunnelError;
use super::config::FunnelPlan;
use super::document::{Document, DropReason, Events, Verdict};
use super::input::{ReadItem, SourceReader};
use super::minhash::Clustering;
use super::mixture::Mixture;
use super::output::JsonlWriter;
use super::report::{FunnelReport, MAX_LISTED_BAD_RECORDS, RemovedSamples, StageReport};
use super::stage::{Prepared, Stage};
use super::tokenize::{DocumentTokenizer, tokenize_output};

/// Counters handed to the progress callback after every chunk.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub documents_read: u64,
    pub bytes_read: u64,
    pub documents_kept: u64,
    pub bad_records: u64,
}

/// What one stage did to one document inside the parallel part.
struct Step {
    stage: usize,
    /// Time spent in the stage on this document (for the report's per-stage CPU time).
    nanos: u64,
    bytes_in: u64,
    outcome: Result<u64, DropReason>,
    events: Events,
}

struct Outcome {
    steps: Vec<Step>,
    /// Time spent preparing the ordered stage that follows (hashing, signatures).
    prepare_nanos: u64,
    kept: Option<(Document, Option<Prepared>)>,
    dropped: Option<(usize, DropReason, Document)>,
}

/// Runs per-document stages `first..first + segment.len()` on one document, then prepares the
/// ordered stage that follows, if any.
fn run_segment(
    segment: &[Stage],
    first: usize,
    ordered: Option<&Stage>,
    mut doc: Document,
) -> Outcome {
    let mut steps = Vec::with_capacity(segment.len());
    for (offset, stage) in segment.iter().enumerate() {
        let bytes_in = doc.byte_len();
        let mut events = Events::new();
        let started = Instant::now();
        let verdict = stage.apply(doc, &mut events);
        let nanos = started.elapsed().as_nanos() as u64;
        match verdict {
            Verdict::Keep(kept) => {
                steps.push(Step {
                    stage: first + offset,
                    nanos,
                    bytes_in,
                    outcome: Ok(kept.byte_len()),
                    events,
                });
                doc = kept;
            }
            Verdict::Drop(dropped, reason) => {
                steps.push(Step {
                    stage: first + offset,
                    nanos,
                    bytes_in,
                    outcome: Err(reason),
                    events,
                });
                return Outcome {
                    steps,
                    prepare_nanos: 0,
                    kept: None,
                    dropped: Some((first + offset, reason, dropped)),
                };
            }
        }
    }
    let started = Instant::now();
    let prepared = ordered.and_then(|stage| stage.prepare(&doc));
    Outcome {
        steps,
        kept: Some((doc, prepared)),
        dropped: None,
        prepare_nanos: started.elapsed().as_nanos() as u64,
    }
}

/// Sends one chunk through every stage; returns the kept documents in reading order.
fn process_chunk(
    stages: &mut [Stage],
    chunk: Vec<Document>,
    reports: &mut [StageReport],
    samples: &mut RemovedSamples,
) -> Vec<Document> {
    let mut live = chunk;
    let mut first = 0;
    while first < stages.len() {
        let ordered_at = (first..stages.len())
            .find(|&i| stages[i].is_ordered())
            .unwrap_or(stages.len());
        let outcomes: Vec<Outcome> = {
            let segment = &stages[first..ordered_at];
            let ordered = stages.get(ordered_at);
            live.into_par_iter()
                .map(|doc| run_segment(segment, first, ordered, doc))
                .collect()
        };
        let mut survivors: Vec<(Document, Option<Prepared>)> = Vec::with_capacity(outcomes.len());
        let mut prepare_nanos = 0u64;
        for outcome in outcomes {
            prepare_nanos += outcome.prepare_nanos;
            for step in &outcome.steps {
                let report = &mut reports[step.stage];
                report.cpu_seconds += step.nanos as f64 * 1e-9;
                match step.outcome {
                    Ok(bytes_out) => report.record_kept(step.bytes_in, bytes_out),
                    Err(reason) => report.record_removed(step.bytes_in, reason),
                }
                report.record_events(&step.events);
            }
            if let Some((stage, reason, doc)) = outcome.dropped {
                samples.offer(stages[stage].name(), reason, doc);
            }
            if let Some(kept) = outcome.kept {
                survivors.push(kept);
            }
        }
        live = Vec::with_capacity(survivors.len());
        if ordered_at < stages.len() {
            let stage = &mut stages[ordered_at];
            let report = &mut reports[ordered_at];
            let started = Instant::now();
            for (doc, prepared) in survivors {
                let bytes_in = doc.byte_len();
                let mut events = Events::new();
                let Some(prepared) = prepared else {
                    live.push(doc);
                    continue;
                };
                match stage.decide(doc, prepared, &mut events) {
                    Verdict::Keep(doc) => {
                        report.record_kept(bytes_in, doc.byte_len());
                        live.push(doc);
                    }
                    Verdict::Drop(doc, reason) => {
                        report.record_removed(bytes_in, reason);
                        samples.offer(stage.name(), reason, doc);
                    }
                }
                report.record_events(&events);
            }
            report.cpu_seconds += prepare_nanos as f64 * 1e-9 + started.elapsed().as_secs_f64();
        } else {
            live.extend(survivors.into_iter().map(|(doc, _)| doc));
        }
        first = ordered_at + 1;
    }
    live
}

/// Writes kept documents to the output, or to their source's spool before a mixture.
fn write_kept(
    sink: &mut Sink,
    kept: &[Document],
    source_index: usize,
    kept_per_source: &mut [u64],
) -> Result<(), FunnelError> {
    let writer = match sink {
        Sink::Direct(w) => w,
        Sink::Spools(spools) => &mut spools[source_index].1,
    };
    for doc in kept {
        writer.write(doc).map_err(FunnelError::Output)?;
    }
    kept_per_source[source_index] += kept.len() as u64;
    Ok(())
}

/// The global MinHash barrier: documents that reach the stage are indexed (their band keys
/// joined into clusters) and spooled to disk; once the input is exhausted they are read back in
/// order, one per cluster kept, and sent on.
struct Barrier {
    stage: usize,
    spool_path: PathBuf,
    spool: Option<JsonlWriter>,
    /// Per spooled document, its node in the union-find (`u32::MAX`: no words, not indexed).
    nodes: Vec<u32>,
    /// The spool being read back, and how many documents of it were read.
    reader: Option<std::io::Lines<std::io::BufReader<std::fs::File>>>,
    read: usize,
}

impl Barrier {
    fn new(stage: usize, report_dir: &std::path::Path) -> Result<Self, FunnelError> {
        let spool_path = report_dir.join("minhash-spool.jsonl");
        let spool = JsonlWriter::create(&spool_path).map_err(FunnelError::Output)?;
        Ok(Barrier {
            stage,
            spool_path,
            spool: Some(spool),
            nodes: Vec::new(),
            reader: None,
            read: 0,
        })
    }

    /// Band keys in parallel, then union-find in reading order; the documents go to the spool.
    fn observe(
        &mut self,
        stages: &mut [Stage],
        reports: &mut [StageReport],
        docs: Vec<Document>,
    ) -> Result<(), FunnelError> {
        let prepared: Vec<(Option<Prepared>, u64)> = {
            let stage = &stages[self.stage];
            docs.par_iter()
                .map(|doc| {
                    let t = Instant::now();
                    (stage.prepare(doc), t.elapsed().as_nanos() as u64)
                })
                .collect()
        };
        let Stage::MinhashDedup(dedup) = &mut stages[self.stage] else {
            return Err(FunnelError::Output(
                "the MinHash barrier is not a minhash_dedup stage".into(),
            ));
        };
        let spool = self
            .spool
            .as_mut()
            .ok_or_else(|| FunnelError::Output("MinHash spool closed".into()))?;
        let mut nanos = 0;
        for (doc, (prepared, n)) in docs.iter().zip(prepared) {
            nanos += n;
            let node = match prepared {
                Some(Prepared::BandKeys(keys)) => dedup.observe(&keys),
                _ => None,
            };
            self.nodes.push(node.unwrap_or(u32::MAX));
            spool.write(doc).map_err(FunnelError::Output)?;
        }
        reports[self.stage].cpu_seconds += nanos as f64 * 1e-9;
        Ok(())
    }

    /// Finishes the clusters and opens the spool for [`Self::next_chunk`].
    fn release(
        &mut self,
        stages: &mut [Stage],
        reports: &mut [StageReport],
    ) -> Result<(), FunnelError> {
        if let Some(spool) = self.spool.take() {
            spool.finish().map_err(FunnelError::Output)?;
        }
        let started = Instant::now();
        let Stage::MinhashDedup(dedup) = &mut stages[self.stage] else {
            return Err(FunnelError::Output(
                "the MinHash barrier is not a minhash_dedup stage".into(),
            ));
        };
        dedup.finish_clusters();
        reports[self.stage].cpu_seconds += started.elapsed().as_secs_f64();
        let file = std::fs::File::open(&self.spool_path)
            .map_err(|e| FunnelError::Output(format!("{}: {e}", self.spool_path.display())))?;
        self.reader = Some(std::io::BufRead::lines(std::io::BufReader::new(file)));
        Ok(())
    }

    /// The next chunk of kept documents from the spool, in reading order (the removed ones are
    /// counted and sampled on the way); `None` at the end, when the spool is deleted.
    fn next_chunk(
        &mut self,
        stages: &[Stage],
        reports: &mut [StageReport],
        samples: &mut RemovedSamples,
        chunk_size: usize,
    ) -> Result<Option<Vec<Document>>, FunnelError> {
        let Stage::MinhashDedup(dedup) = &stages[self.stage] else {
            return Err(FunnelError::Output(
                "the MinHash barrier is not a minhash_dedup stage".into(),
            ));
        };
        let name = stages[self.stage].name();
        let report = &mut reports[self.stage];
        let path = &self.spool_path;
        let Some(reader) = self.reader.as_mut() else {
            return Ok(None);
        };
        let mut chunk = Vec::with_capacity(chunk_size);
        for line in reader.by_ref() {
            let doc: Document = line
                .map_err(|e| e.to_string())
                .and_then(|l| serde_json::from_str(&l).map_err(|e| e.to_string()))
                .map_err(|e| FunnelError::Output(format!("{}: {e}", path.display())))?;
            let node = self.nodes.get(self.read).copied().unwrap_or(u32::MAX);
            self.read += 1;
            let bytes = doc.byte_len();
            if node != u32::MAX && !dedup.is_kept(node) {
                report.record_removed(bytes, DropReason::NearDuplicate);
                samples.offer(name, DropReason::NearDuplicate, doc);
            } else {
                report.record_kept(bytes, bytes);
                chunk.push(doc);
                if chunk.len() == chunk_size {
                    break;
                }
            }
        }
        if chunk.is_empty() {
            self.reader = None;
            let _ = std::fs::remove_file(path);
            return Ok(None);
        }
        Ok(Some(chunk))
    }
}

/// Where kept documents go while the run reads: the output, or one spool per source before a
/// mixture blends them.
enum Sink {
    Direct(JsonlWriter),
    Spools(Vec<(PathBuf, JsonlWriter)>),
}

fn spool_path(plan: &FunnelPlan, source: &str) -> PathBuf {
    plan.report_dir
        .join("spool")
        .join(format!("{source}.jsonl"))
}

/// Runs the funnel; `on_progress` is called after every chunk. A plan with a `[tokenize]` step
/// needs a `tokenizer`; without one that step is an error.
pub fn run(
    mut plan: FunnelPlan,
    tokenizer: Option<&dyn DocumentTokenizer>,
    on_progress: &dyn Fn(&Progress),
) -> Result<FunnelReport, FunnelError> {
    if plan.tokenize.is_some() && tokenizer.is_none() {
        return Err(FunnelError::Config(
            "[tokenize] is set but no tokenizer was given to the run".into(),
        ));
    }
    let started = Instant::now();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(plan.threads)
        .build()
        .map_err(|e| FunnelError::Config(format!("cannot start {} threads: {e}", plan.threads)))?;
    let mut report = FunnelReport {
        threads: pool.current_num_threads(),
        ..FunnelReport::default()
    };
    let mut reports: Vec<StageReport> = plan
        .stages
        .iter()
        .map(|s| StageReport::new(s.name()))
        .collect();
    let mut samples = RemovedSamples::new(plan.removed_samples, plan.seed);
    let mut progress = Progress::default();
    let mut kept_per_source = vec![0u64; plan.sources.len()];
    let mut sink = match &plan.mixture {
        None => Sink::Direct(JsonlWriter::create(&plan.output).map_err(FunnelError::Output)?),
        Some(_) => Sink::Spools(
            plan.sources
                .iter()
                .map(|s| {
                    let path = spool_path(&plan, &s.name);
                    JsonlWriter::create(&path).map(|w| (path, w))
                })
                .collect::<Result<_, _>>()
                .map_err(FunnelError::Output)?,
        ),
    };

    // A `minhash_dedup` stage with global clustering is a barrier: documents stop there until
    // the input is exhausted.
    let global: Vec<usize> = plan
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Stage::MinhashDedup(m) if m.clustering == Clustering::Global))
        .map(|(i, _)| i)
        .collect();
    if global.len() > 1 {
        return Err(FunnelError::Config(format!(
            "{} minhash_dedup stages use clustering = \"global\"; at most one can (set clustering = \"streaming\" on the others)",
            global.len()
        )));
    }
    let mut barrier = match global.first() {
        Some(&stage) => Some(Barrier::new(stage, &plan.report_dir)?),
        None => None,
    };
    let before_barrier = barrier.as_ref().map_or(plan.stages.len(), |b| b.stage);

    for (source_index, source) in plan.sources.iter().enumerate() {
        report.input.files += source.files.len() as u64;
        let mut reader = SourceReader::new(source.clone());
        loop {
            let mut chunk = Vec::with_capacity(plan.chunk_size);
            for item in reader.by_ref() {
                match item {
                    ReadItem::Document(doc) => {
                        progress.documents_read += 1;
                        progress.bytes_read += doc.byte_len();
                        chunk.push(doc);
                        if chunk.len() == plan.chunk_size {
                            break;
                        }
                    }
                    ReadItem::Bad(bad) => {
                        if plan.strict {
                            return Err(FunnelError::BadInput {
                                location: bad.location,
                                error: bad.error,
                            });
                        }
                        progress.bad_records += 1;
                        if report.input.bad_record_examples.len() < MAX_LISTED_BAD_RECORDS {
                            report.input.bad_record_examples.push(bad);
                        }
                    }
                }
            }
            if chunk.is_empty() {
                break;
            }
            let kept = pool.install(|| {
                process_chunk(
                    &mut plan.stages[..before_barrier],
                    chunk,
                    &mut reports[..before_barrier],
                    &mut samples,
                )
            });
            match &mut barrier {
                Some(barrier) => {
                    pool.install(|| barrier.observe(&mut plan.stages, &mut reports, kept))?;
                }
                None => {
                    write_kept(&mut sink, &kept, source_index, &mut kept_per_source)?;
                    progress.documents_kept += kept.len() as u64;
                }
            }
            on_progress(&progress);
        }
    }
    if let Some(mut barrier) = barrier {
        // Every document is observed: the clusters are final. Send the spooled documents on
        // through the stages after the barrier.
        let at = barrier.stage;
        let source_index: std::collections::HashMap<&str, usize> = plan
            .sources
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        barrier.release(&mut plan.stages, &mut reports)?;
        while let Some(chunk) =
            barrier.next_chunk(&plan.stages, &mut reports, &mut samples, plan.chunk_size)?
        {
            let kept = pool.install(|| {
                process_chunk(
                    &mut plan.stages[at + 1..],
                    chunk,
                    &mut reports[at + 1..],
                    &mut samples,
                )
            });
            for doc in &kept {
                let index = source_index.get(doc.source.as_str()).copied().unwrap_or(0);
                write_kept(
                    &mut sink,
                    std::slice::from_ref(doc),
                    index,
                    &mut kept_per_source,
                )?;
            }
            progress.documents_kept += kept.len() as u64;
            on_progress(&progress);
        }
    }
    for stage in &mut plan.stages {
        stage.finish().map_err(FunnelError::Output)?;
    }
    for stage in &plan.stages {
        match stage {
            Stage::MinhashDedup(s) => {
                report.near_duplicate_clusters = Some(s.clusters_with_duplicates)
            }
            Stage::ExactDedup(s) => report.exact_fingerprints_loaded = Some(s.loaded as u64),
            _ => {}
        }
    }

    let written_per_source = match sink {
        Sink::Direct(writer) => {
            report.output.documents = writer.documents;
            report.output.bytes = writer.bytes;
            writer.finish().map_err(FunnelError::Output)?;
            kept_per_source.clone()
        }
        Sink::Spools(spools) => {
            let mut paths = Vec::new();
            for (path, writer) in spools {
                writer.finish().map_err(FunnelError::Output)?;
                paths.push(path);
            }
            let mixture = plan
                .mixture
                .as_ref()
                .ok_or_else(|| FunnelError::Output("spools without mixture".into()))?;
            let written = blend(mixture, &paths, &kept_per_source, &plan.output, &mut report)?;
            let _ = std::fs::remove_dir_all(plan.report_dir.join("spool"));
            written
        }
    };
    for (i, source) in plan.sources.iter().enumerate() {
        report
            .output
            .kept_per_source
            .insert(source.name.clone(), kept_per_source[i]);
        report
            .output
            .written_per_source
            .insert(source.name.clone(), written_per_source[i]);
    }
    report.output.path = plan.output.display().to_string();
    if let (Some(settings), Some(tokenizer)) = (&plan.tokenize, tokenizer) {
        let tokenized = pool
            .install(|| tokenize_output(&plan.output, settings, tokenizer, plan.chunk_size))
            .map_err(FunnelError::Output)?;
        report.tokenized = Some(tokenized);
    }
    report.input.documents = progress.documents_read;
    report.input.bytes = progress.bytes_read;
    report.input.bad_records = progress.bad_records;
    report.stages = reports;
    report.wall_seconds = started.elapsed().as_secs_f64();
    let seconds = report.wall_seconds.max(1e-9);
    report.documents_per_second = progress.documents_read as f64 / seconds;
    report.megabytes_per_second = progress.bytes_read as f64 / 1e6 / seconds;
    report
        .write(&plan.report_dir, &samples)
        .map_err(FunnelError::Output)?;
    Ok(report)
}

/// Streams the spools into the output in the mixture's order; returns documents written per
/// source. The schedule visits each source's documents in order (wrapping for extra epochs), so
/// each spool is read front to back, reopened at each new epoch.
fn blend(
    mixture: &Mixture,
    spools: &[PathBuf],
    kept: &[u64],
    output: &std::path::Path,
    report: &mut FunnelReport,
) -> Result<Vec<u64>, FunnelError> {
    use std::io::BufRead;
    let out_err = FunnelError::Output;
    let mut writer = JsonlWriter::create(output).map_err(out_err)?;
    let open =
        |path: &PathBuf| -> Result<std::io::Lines<std::io::BufReader<std::fs::File>>, FunnelError> {
            let file = std::fs::File::open(path)
                .map_err(|e| FunnelError::Output(format!("{}: {e}", path.display())))?;
            Ok(std::io::BufReader::new(file).lines())
        };
    let mut readers = spools.iter().map(open).collect::<Result<Vec<_>, _>>()?;
    let mut written = vec![0u64; spools.len()];
    for (source, index) in mixture.schedule(kept) {
        if index == 0 && written[source] > 0 {
            readers[source] = open(&spools[source])?;
        }
        let line = readers[source]
            .next()
            .ok_or_else(|| {
                FunnelError::Output(format!("{} ended early", spools[source].display()))
            })?
            .map_err(|e| FunnelError::Output(format!("{}: {e}", spools[source].display())))?;
        let doc: Document = serde_json::from_str(&line)
            .map_err(|e| FunnelError::Output(format!("{}: {e}", spools[source].display())))?;
        writer.write(&doc).map_err(FunnelError::Output)?;
        written[source] += 1;
    }
    report.output.documents = writer.documents;
    report.output.bytes = writer.bytes;
    writer.finish().map_err(FunnelError::Output)?;
    Ok(written)
}
