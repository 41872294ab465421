//! End-to-end runs of the funnel on small hand-made inputs: report accounting, bad input,
//! strict mode, determinism across thread counts, persisted dedup state, mixtures, HTML/WARC and
//! Parquet sources.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use stoke_data::funnel::{self, FunnelError, FunnelFile, FunnelReport};

/// A paragraph that passes the Gopher quality filter (60 words, stop words, long enough words).
fn good_text(i: usize) -> String {
    let words: Vec<String> = (0..50).map(|k| format!("word{}x{}", i, k)).collect();
    format!(
        "The story of the river and that old house with {} ends here.",
        words.join(" ")
    )
}

fn jsonl_line(id: &str, text: &str) -> String {
    serde_json::json!({ "id": id, "text": text }).to_string() + "\n"
}

fn run_config(dir: &Path, toml_text: &str) -> Result<FunnelReport, FunnelError> {
    let plan = FunnelFile::parse(toml_text)?.validate(dir)?;
    funnel::run(plan, None, &|_| {})
}

fn read_output(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn write_input(dir: &Path) -> PathBuf {
    let mut input = String::new();
    for i in 0..5 {
        input += &jsonl_line(&format!("good{i}"), &good_text(i));
    }
    input += &jsonl_line("short", "Too short to keep.");
    input += "{ this line is not json\n";
    input += &jsonl_line(
        "pii",
        &format!("{} Mail jane@example.org today.", good_text(9)),
    );
    // Same text up to case and whitespace (stop words stay lowercase: Gopher matches them exactly).
    input += &jsonl_line(
        "dup",
        &good_text(0)
            .replacen("story", "STORY", 1)
            .replace(" house", "\n  house"),
    );
    let path = dir.join("in/docs.jsonl");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, input).unwrap();
    path
}

const BASIC: &str = r#"
[run]
output = "out/kept.jsonl"
report_dir = "out/report"
removed_samples = 2

[[source]]
name = "web"
paths = ["in"]
format = "jsonl"

[[stage]]
kind = "gopher_quality"

[[stage]]
kind = "pii"

[[stage]]
kind = "exact_dedup"
"#;

#[test]
fn report_counts_chain_from_stage_to_stage_and_reasons_add_up() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path());
    let report = run_config(dir.path(), BASIC).unwrap();
    assert_eq!(report.input.documents, 8);
    assert_eq!(report.input.bad_records, 1);
    assert_eq!(
        report.input.bad_record_examples[0].location,
        format!("{}:7", input.display())
    );
    let mut previous = report.input.documents;
    for stage in &report.stages {
        assert_eq!(stage.documents_in, previous, "{}", stage.name);
        let removed: u64 = stage.removed.values().sum();
        assert_eq!(
            stage.documents_in - stage.documents_out,
            removed,
            "{}",
            stage.name
        );
        previous = stage.documents_out;
    }
    assert_eq!(report.stages[0].removed.get("gopher_short_doc"), Some(&1));
    assert!(
        report.stages.iter().all(|s| s.cpu_seconds > 0.0),
        "every stage did timed work"
    );
    assert_eq!(report.stages[1].events.get("emails_redacted"), Some(&1));
    assert_eq!(report.stages[2].removed.get("exact_duplicate"), Some(&1));
    let output = read_output(&dir.path().join("out/kept.jsonl"));
    assert_eq!(output.len() as u64, report.output.documents);
    let ids: Vec<&str> = output.iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        vec!["good0", "good1", "good2", "good3", "good4", "pii"]
    );
    assert!(
        output[5]["text"]
            .as_str()
            .unwrap()
            .ends_with("Mail <EMAIL> today.")
    );
}

#[test]
fn report_files_and_removed_samples_are_written() {
    let dir = tempfile::tempdir().unwrap();
    write_input(dir.path());
    run_config(dir.path(), BASIC).unwrap();
    let report_dir = dir.path().join("out/report");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report_dir.join("report.json")).unwrap())
            .unwrap();
    assert_eq!(json["stages"].as_array().unwrap().len(), 3);
    let svg = std::fs::read_to_string(report_dir.join("funnel.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("exact_dedup"));
    let short = std::fs::read_to_string(report_dir.join("removed/gopher_short_doc.jsonl")).unwrap();
    let sample: serde_json::Value = serde_json::from_str(short.lines().next().unwrap()).unwrap();
    assert_eq!(sample["id"], "short");
    assert_eq!(sample["stage"], "gopher_quality");
    assert!(report_dir.join("removed/exact_duplicate.jsonl").exists());
}

#[test]
fn strict_mode_stops_at_the_first_bad_record_with_its_location() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path());
    let strict = BASIC.replace("removed_samples = 2", "removed_samples = 2\nstrict = true");
    match run_config(dir.path(), &strict) {
        Err(FunnelError::BadInput { location, .. }) => {
            assert_eq!(location, format!("{}:7", input.display()))
        }
        other => panic!("expected a bad-input error, got {other:?}"),
    }
}

#[test]
fn unknown_config_keys_are_rejected_by_name() {
    let typo = BASIC.replace("removed_samples = 2", "removed_sample = 2");
    let err = FunnelFile::parse(&typo).unwrap_err().to_string();
    assert!(err.contains("removed_sample"), "{err}");
}

#[test]
fn output_is_identical_for_one_and_many_threads() {
    let dir = tempfile::tempdir().unwrap();
    let mut input = String::new();
    for i in 0..1500 {
        // Every 7th document repeats an earlier one; every 11th is too short.
        let text = if i % 11 == 0 {
            "short".to_string()
        } else {
            good_text(if i % 7 == 0 { i / 2 } else { i })
        };
        input += &jsonl_line(&format!("d{i}"), &text);
    }
    std::fs::create_dir_all(dir.path().join("in")).unwrap();
    std::fs::write(dir.path().join("in/a.jsonl"), input).unwrap();
    let config = |threads: usize, out: &str| {
        format!(
            "[run]\noutput = \"{out}/kept.jsonl\"\nreport_dir = \"{out}/report\"\nchunk_size = 64\nthreads = {threads}\n\
             [[source]]\nname = \"web\"\npaths = [\"in\"]\nformat = \"jsonl\"\n\
             [[stage]]\nkind = \"gopher_quality\"\n[[stage]]\nkind = \"exact_dedup\"\n\
             [[stage]]\nkind = \"minhash_dedup\"\n[[stage]]\nkind = \"line_dedup\"\n[[stage]]\nkind = \"gopher_repetition\"\n"
        )
    };
    let one = run_config(dir.path(), &config(1, "one")).unwrap();
    let many = run_config(dir.path(), &config(4, "many")).unwrap();
    assert_eq!(many.threads, 4);
    let a = std::fs::read(dir.path().join("one/kept.jsonl")).unwrap();
    let b = std::fs::read(dir.path().join("many/kept.jsonl")).unwrap();
    assert!(
        one.output.documents > 1000 && one.output.documents < 1500,
        "{}",
        one.output.documents
    );
    assert_eq!(a, b);
    for (x, y) in one.stages.iter().zip(&many.stages) {
        assert_eq!((x.documents_out, &x.removed), (y.documents_out, &y.removed));
    }
}

#[test]
fn exact_dedup_state_removes_what_an_earlier_run_kept() {
    let dir = tempfile::tempdir().unwrap();
    write_input(dir.path());
    let config = BASIC.replace(
        "kind = \"exact_dedup\"",
        "kind = \"exact_dedup\"\nstate_file = \"state/exact.xxh3\"",
    );
    let first = run_config(dir.path(), &config).unwrap();
    assert_eq!(first.output.documents, 6);
    let second = run_config(dir.path(), &config).unwrap();
    assert_eq!(second.exact_fingerprints_loaded, Some(6));
    assert_eq!(second.output.documents, 0);
    assert_eq!(second.stages[2].removed.get("exact_duplicate"), Some(&7));
}

#[test]
fn mixture_blends_by_weight_and_upsamples_by_epochs() {
    let dir = tempfile::tempdir().unwrap();
    for (name, count) in [("web", 30), ("books", 5)] {
        let body: String = (0..count)
            .map(|i| jsonl_line(&format!("{name}{i}"), &good_text(i + 100 * count)))
            .collect();
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
        std::fs::write(dir.path().join(format!("{name}/part.jsonl")), body).unwrap();
    }
    let config = r#"
[run]
output = "out/mix.jsonl.zst"
report_dir = "out/report"
[[source]]
name = "web"
paths = ["web"]
format = "jsonl"
[[source]]
name = "books"
paths = ["books"]
format = "jsonl"
[mixture]
sources = [{ name = "web", weight = 3.0 }, { name = "books", weight = 1.0, epochs = 2.0 }]
"#;
    let report = run_config(dir.path(), config).unwrap();
    assert_eq!(report.output.written_per_source["books"], 10);
    assert_eq!(report.output.written_per_source["web"], 30);
    let compressed = std::fs::read(dir.path().join("out/mix.jsonl.zst")).unwrap();
    let text = String::from_utf8(zstd::decode_all(&compressed[..]).unwrap()).unwrap();
    let sources: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["source"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(sources.len(), 40);
    // Weight 3:1: books once in every 4 documents (at step 2 the deficits tie and the source
    // listed first wins, so books comes third).
    assert_eq!(
        &sources[..8],
        &["web", "web", "books", "web", "web", "web", "books", "web"]
    );
    assert_eq!(sources.iter().filter(|s| *s == "books").count(), 10);
    assert!(
        !dir.path().join("out/report/spool").exists(),
        "spools are cleaned up"
    );
}

fn warc_record(id: &str, uri: &str, html: &str) -> String {
    let http = format!("HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n{html}");
    format!(
        "WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: {id}\r\nWARC-Target-URI: {uri}\r\nContent-Length: {}\r\n\r\n{http}\r\n\r\n",
        http.len()
    )
}

#[test]
fn warc_html_is_extracted_and_blocked_domains_removed() {
    let dir = tempfile::tempdir().unwrap();
    let page = |body: &str| {
        format!(
            "<html><body><nav><a href='/'>Home</a></nav><p>{body}</p><footer>(c) site</footer></body></html>"
        )
    };
    let warc = warc_record(
        "<urn:a>",
        "https://good.example/a",
        &page("Main text of page A."),
    ) + &warc_record(
        "<urn:b>",
        "https://ads.bad.example/b",
        &page("Main text of page B."),
    );
    std::fs::create_dir_all(dir.path().join("crawl")).unwrap();
    std::fs::write(dir.path().join("crawl/x.warc"), warc).unwrap();
    let config = r#"
[run]
output = "out/kept.jsonl"
report_dir = "out/report"
[[source]]
name = "crawl"
paths = ["crawl"]
format = "warc"
[[stage]]
kind = "extract"
[[stage]]
kind = "safety"
blocked_domains = ["bad.example"]
"#;
    let report = run_config(dir.path(), config).unwrap();
    assert_eq!(report.stages[1].removed.get("blocked_url"), Some(&1));
    let output = read_output(&dir.path().join("out/kept.jsonl"));
    assert_eq!(output.len(), 1);
    assert_eq!(output[0]["text"], "Main text of page A.");
    assert_eq!(output[0]["metadata"]["url"], "https://good.example/a");
    let without_extract = config.replace("[[stage]]\nkind = \"extract\"\n", "");
    let err = FunnelFile::parse(&without_extract)
        .unwrap()
        .validate(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("extract"), "{err}");
}

#[test]
fn parquet_rows_become_documents() {
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("pq")).unwrap();
    let schema = Arc::new(
        parse_message_type(
            "message doc { REQUIRED BYTE_ARRAY id (UTF8); REQUIRED BYTE_ARRAY content (UTF8); }",
        )
        .unwrap(),
    );
    let file = std::fs::File::create(dir.path().join("pq/part-0.parquet")).unwrap();
    let mut writer =
        SerializedFileWriter::new(file, schema, Arc::new(WriterProperties::builder().build()))
            .unwrap();
    let mut group = writer.next_row_group().unwrap();
    let columns: [Vec<ByteArray>; 2] = [
        vec!["p1".into(), "p2".into()],
        vec![good_text(1).as_str().into(), "Too short.".into()],
    ];
    for values in columns {
        let mut column = group.next_column().unwrap().unwrap();
        column
            .typed::<ByteArrayType>()
            .write_batch(&values, None, None)
            .unwrap();
        column.close().unwrap();
    }
    group.close().unwrap();
    writer.close().unwrap();
    let config = r#"
[run]
output = "out/kept.jsonl"
report_dir = "out/report"
[[source]]
name = "pq"
paths = ["pq"]
format = "parquet"
text_field = "content"
[[stage]]
kind = "gopher_quality"
"#;
    let report = run_config(dir.path(), config).unwrap();
    assert_eq!((report.input.documents, report.output.documents), (2, 1));
    let output = read_output(&dir.path().join("out/kept.jsonl"));
    assert_eq!(output[0]["id"], "p1");
}

/// Byte-level stand-in for a real tokenizer: ids 0-255 are bytes, 256 ends a document.
struct ByteTokenizer;

impl funnel::DocumentTokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn vocab_size(&self) -> u64 {
        257
    }
    fn end_of_text(&self) -> u32 {
        256
    }
}

const TOKENIZE: &str = r#"
[tokenize]
tokenizer = "tok"
end_of_text = "<eot>"
output_dir = "out/shards"
prefix = "web"
max_tokens_per_shard = 2000
"#;

#[test]
fn tokenize_step_writes_the_output_as_shards_in_output_order() {
    let dir = tempfile::tempdir().unwrap();
    write_input(dir.path());
    let config = format!("{BASIC}{TOKENIZE}").replace("out/kept.jsonl", "out/kept.jsonl.zst");
    let plan = FunnelFile::parse(&config)
        .unwrap()
        .validate(dir.path())
        .unwrap();
    let report = funnel::run(plan, Some(&ByteTokenizer), &|_| {}).unwrap();
    let tokenized = report.tokenized.unwrap();
    assert_eq!(tokenized.documents, 6);
    assert!(
        tokenized.shards.len() >= 2,
        "{} shards",
        tokenized.shards.len()
    );
    let compressed = std::fs::read(dir.path().join("out/kept.jsonl.zst")).unwrap();
    let texts: Vec<String> = String::from_utf8(zstd::decode_all(&compressed[..]).unwrap())
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut read_back = Vec::new();
    for reader in stoke_data::shard::open_dir(&dir.path().join("out/shards")).unwrap() {
        for doc in 0..reader.num_docs() {
            read_back.push(reader.document(doc).unwrap().to_vec());
        }
    }
    let expected: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| t.bytes().map(u32::from).chain([256]).collect())
        .collect();
    assert_eq!(read_back, expected);
}

#[test]
fn tokenize_step_without_a_tokenizer_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    write_input(dir.path());
    let plan = FunnelFile::parse(&format!("{BASIC}{TOKENIZE}"))
        .unwrap()
        .validate(dir.path())
        .unwrap();
    let err = funnel::run(plan, None, &|_| {}).unwrap_err();
    assert!(
        matches!(err, FunnelError::Config(ref m) if m.contains("tokenize")),
        "{err}"
    );
}

#[test]
fn html_files_and_gzipped_warc_are_read_and_extracted() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("pages")).unwrap();
    std::fs::write(
        dir.path().join("pages/a.html"),
        "<html><body><nav>Menu</nav><p>An article paragraph.</p></body></html>",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("pages/b.htm"),
        "<html><body><nav><a href='/'>Only a menu</a></nav></body></html>",
    )
    .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(
        warc_record(
            "<urn:z>",
            "https://z.example/",
            "<p>From a gzipped WARC.</p>",
        )
        .as_bytes(),
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("crawl")).unwrap();
    std::fs::write(dir.path().join("crawl/c.warc.gz"), gz.finish().unwrap()).unwrap();
    let config = r#"
[run]
output = "out/kept.jsonl"
report_dir = "out/report"
[[source]]
name = "pages"
paths = ["pages"]
format = "html"
[[source]]
name = "crawl"
paths = ["crawl"]
format = "warc"
[[stage]]
kind = "extract"
"#;
    let report = run_config(dir.path(), config).unwrap();
    assert_eq!(report.input.documents, 3);
    assert_eq!(report.stages[0].removed.get("extraction_empty"), Some(&1));
    let texts: Vec<String> = read_output(&dir.path().join("out/kept.jsonl"))
        .iter()
        .map(|d| d["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(texts, vec!["An article paragraph.", "From a gzipped WARC."]);
}

/// Near-duplicate families: `family{f}-v{k}` are variants of one text (two words changed), and
/// the chain family holds two halves that overlap less with each other than with the whole.
fn near_duplicate_corpus() -> Vec<(String, String)> {
    let base = |f: usize, n: usize| -> Vec<String> {
        (0..n)
            .map(|k| format!("w{f}z{}", (k * 7919 + f * 31) % 10007))
            .collect()
    };
    let mut docs = Vec::new();
    for f in 0..6 {
        for v in 0..3 {
            let mut words = base(f, 120);
            words[10 + 30 * v] = format!("changed{v}");
            words[20 + 30 * v] = format!("edited{v}");
            docs.push((format!("family{f}-v{v}"), words.join(" ")));
        }
    }
    for f in 6..10 {
        docs.push((format!("family{f}-alone"), base(f, 120).join(" ")));
    }
    let whole = base(10, 160);
    docs.push(("family10-first".into(), whole[..130].join(" ")));
    docs.push(("family10-last".into(), whole[30..].join(" ")));
    docs.push(("family10-whole".into(), whole.join(" ")));
    docs
}

/// Runs MinHash dedup then a stage after it on `docs` in the given order: (kept per family,
/// clusters with duplicates, kept ids).
fn minhash_run(
    dir: &Path,
    docs: &[(String, String)],
    clustering: &str,
) -> (Vec<(String, usize)>, u64, Vec<String>) {
    let input: String = docs.iter().map(|(id, text)| jsonl_line(id, text)).collect();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("in.jsonl"), input).unwrap();
    let config = format!(
        "[run]\noutput = \"out.jsonl\"\nreport_dir = \"report\"\nchunk_size = 4\n\
         [[source]]\nname = \"s\"\npaths = [\"in.jsonl\"]\nformat = \"jsonl\"\n\
         [[stage]]\nkind = \"minhash_dedup\"\nclustering = \"{clustering}\"\n\
         [[stage]]\nkind = \"exact_dedup\"\n"
    );
    let report = run_config(dir, &config).unwrap();
    let ids: Vec<String> = read_output(&dir.join("out.jsonl"))
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect();
    let mut per_family: std::collections::BTreeMap<String, usize> = Default::default();
    for id in &ids {
        *per_family
            .entry(id.split('-').next().unwrap().to_string())
            .or_default() += 1;
    }
    assert!(
        !dir.join("report/minhash-spool.jsonl").exists(),
        "the MinHash spool is removed after the run"
    );
    let stage = report
        .stages
        .iter()
        .find(|s| s.name == "minhash_dedup")
        .unwrap();
    assert_eq!(stage.documents_in, docs.len() as u64);
    assert_eq!(
        stage.documents_out,
        ids.len() as u64,
        "the stage after the barrier saw every kept document"
    );
    (
        per_family.into_iter().collect(),
        report.near_duplicate_clusters.unwrap(),
        ids,
    )
}

#[test]
fn minhash_clusters_do_not_depend_on_the_input_order() {
    let dir = tempfile::tempdir().unwrap();
    let docs = near_duplicate_corpus();
    let mut reversed = docs.clone();
    reversed.reverse();
    let mut interleaved: Vec<_> = docs.iter().step_by(2).cloned().collect();
    interleaved.extend(docs.iter().skip(1).step_by(2).cloned());
    let (families, clusters, ids) = minhash_run(&dir.path().join("a"), &docs, "global");
    // Every family is one cluster: one document each.
    assert_eq!(families.len(), 11, "{families:?}");
    assert!(families.iter().all(|(_, n)| *n == 1), "{families:?}");
    assert_eq!(clusters, 7, "six families of variants and the chain");
    // The kept member of a cluster is its earliest in reading order.
    assert!(ids.contains(&"family0-v0".to_string()) && ids.contains(&"family10-first".to_string()));
    for (name, order) in [("reversed", &reversed), ("interleaved", &interleaved)] {
        let (f, c, _) = minhash_run(&dir.path().join(name), order, "global");
        assert_eq!((f, c), (families.clone(), clusters), "{name} order");
    }
    // Streaming decides on arrival: two variants that are not candidates of each other both
    // stay when they come before the one that links them.
    let (streaming, _, _) = minhash_run(&dir.path().join("streaming"), &docs, "streaming");
    assert!(streaming.iter().any(|(_, n)| *n > 1), "{streaming:?}");
}
