//! `stoke eval run` as the built binary on the tiny Qwen2 fixture: a multiple-choice task, a
//! generative task graded by exact match and a perplexity task score the same against the
//! model folder and against `stoke serve` over the same model; an interrupted run resumes
//! without losing or double-counting an item; bad task files, data and endpoints give errors
//! naming the file and line, or the URL.

mod server;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};
use server::{Server, fixture_dir};

fn stoke(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
        .args(args)
        .output()
        .expect("stoke runs")
}

fn ok(args: &[&str]) -> String {
    let output = stoke(args);
    assert!(
        output.status.success(),
        "stoke {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn failure(args: &[&str]) -> String {
    let output = stoke(args);
    assert!(!output.status.success(), "stoke {args:?} should fail");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Three task files over local data in `dir`.
fn write_tasks(dir: &Path) {
    let mut mc = String::new();
    let mut gen_items = String::new();
    for i in 0..12u32 {
        let (a, b): (u32, u32) = (i % 7 + 2, i % 5 + 3);
        let right = a + b;
        let choices = [right, right + 1, right + 10, right.saturating_sub(1)];
        let gold = (i % 4) as usize;
        let mut shown: Vec<String> = choices.iter().map(|c| c.to_string()).collect();
        shown.swap(0, gold);
        mc.push_str(
            &json!({"question": format!("What is {a} plus {b}?"), "choices": shown, "gold": gold})
                .to_string(),
        );
        mc.push('\n');
        gen_items.push_str(
            &json!({"q": format!("{a} + {b} ="), "answer": right.to_string()}).to_string(),
        );
        gen_items.push('\n');
    }
    std::fs::write(dir.join("mc.jsonl"), mc).unwrap();
    std::fs::write(dir.join("gen.jsonl"), gen_items).unwrap();
    std::fs::write(
        dir.join("text.csv"),
        "id,text\n1,\"Shall I compare thee to a summer's day?\"\n2,Thou art more lovely and more temperate.\n3,\"Rough winds do shake the darling buds of May, and summer's lease hath all too short a date.\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("mc.toml"),
        r#"output_type = "multiple_choice"
data = "mc.jsonl"
doc_to_text = "Question: {{question}}\nAnswer:"
doc_to_choice = "choices"
doc_to_target = "gold"
num_fewshot = 2
"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("gen.toml"),
        r#"output_type = "generate_until"
data = "gen.jsonl"
doc_to_text = "q"
doc_to_target = "answer"

[generation]
max_tokens = 6
n = 2
pass_at = [1, 2]

[grader]
kind = "exact_match"
"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("ppl.toml"),
        "output_type = \"loglikelihood_rolling\"\ndata = \"text.csv\"\ndoc_to_text = \"text\"\n",
    )
    .unwrap();
}

fn results(dir: &Path) -> Vec<Value> {
    serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap()
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn task_args<'a>(dir: &'a str, tasks: &'a [String]) -> Vec<&'a str> {
    let mut args = vec!["eval", "run", "--out", dir];
    for task in tasks {
        args.extend(["--task", task.as_str()]);
    }
    args
}

#[test]
fn a_folder_and_a_server_score_the_same_and_runs_resume() {
    let work = tempfile::tempdir().unwrap();
    write_tasks(work.path());
    let tasks: Vec<String> = ["mc.toml", "gen.toml", "ppl.toml"]
        .iter()
        .map(|t| work.path().join(t).display().to_string())
        .collect();
    let model = fixture_dir().display().to_string();

    let local = work.path().join("local");
    let local_str = local.display().to_string();
    let mut args = task_args(&local_str, &tasks);
    args.extend(["--model", &model]);
    let printed = ok(&args);
    assert!(printed.contains("acc"), "{printed}");
    let from_folder = results(&local);
    assert_eq!(from_folder.len(), 3);
    let metric = |r: &Value, name: &str| r["metrics"][name]["value"].as_f64().unwrap();
    assert_eq!(from_folder[0]["items"], 12);
    for (result, names) in from_folder.iter().zip([
        &["acc", "acc_norm"][..],
        &["pass@1", "pass@2", "mean@2", "maj@2"],
        &["bits_per_byte"],
    ]) {
        for name in names {
            let value = metric(result, name);
            assert!(value.is_finite() && value >= 0.0, "{name} = {value}");
            assert!(result["metrics"][name]["stderr"].as_f64().unwrap() >= 0.0);
        }
    }
    assert!(metric(&from_folder[2], "bits_per_byte") > 0.0);

    // The same tasks through stoke serve over the same model.
    let server = Server::start();
    let remote = work.path().join("remote");
    let remote_str = remote.display().to_string();
    let mut args = task_args(&remote_str, &tasks);
    args.extend(["--url", &server.url, "--tokenizer", &model]);
    ok(&args);
    server.stop();
    let from_server = results(&remote);
    for (a, b) in from_folder.iter().zip(&from_server) {
        for (name, m) in a["metrics"].as_object().unwrap() {
            let (x, y) = (m["value"].as_f64().unwrap(), metric(b, name));
            if name == "bits_per_byte" {
                assert!(
                    (x - y).abs() < 1e-5 * x.abs().max(1.0),
                    "{name}: {x} vs {y}"
                );
            } else {
                assert_eq!(x, y, "{} {name}", a["task"]);
            }
        }
    }
    // Per choice, the log-likelihoods agree within the server's parity bound.
    let folder_mc = records(&local.join("mc/items.jsonl"));
    let server_mc = records(&remote.join("mc/items.jsonl"));
    for (a, b) in folder_mc.iter().zip(&server_mc) {
        let la = a["outcomes"]["loglikelihoods"].as_array().unwrap();
        let lb = b["outcomes"]["loglikelihoods"].as_array().unwrap();
        for (x, y) in la.iter().zip(lb) {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() < 1e-4, "{x} vs {y}");
        }
        assert_eq!(a["outcomes"]["greedy"], b["outcomes"]["greedy"]);
    }

    // Resume: a finished run reads every item back; a run killed mid-write (torn last line,
    // two lines lost) redoes exactly the missing items.
    let items = local.join("mc/items.jsonl");
    let text = std::fs::read_to_string(&items).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let kept = lines[..9].join("\n") + "\n" + &lines[9][..lines[9].len() / 2];
    std::fs::write(&items, kept).unwrap();
    let mut args = task_args(&local_str, &tasks[..1]);
    args.extend(["--model", &model]);
    let printed = ok(&args);
    assert!(printed.contains("12 items (9 resumed)"), "{printed}");
    let again = records(&items);
    assert_eq!(again.len(), 12);
    let mut indices: Vec<u64> = again.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    indices.sort_unstable();
    assert_eq!(indices, (0..12).collect::<Vec<_>>());
    assert_eq!(results(&local)[0]["metrics"], from_folder[0]["metrics"]);
}

#[test]
fn bad_tasks_data_and_endpoints_are_named() {
    let work = tempfile::tempdir().unwrap();
    write_tasks(work.path());
    let model = fixture_dir().display().to_string();
    let out = work.path().join("out").display().to_string();
    let run = |task: &Path| {
        failure(&[
            "eval",
            "run",
            "--task",
            &task.display().to_string(),
            "--model",
            &model,
            "--out",
            &out,
        ])
    };

    let unknown = work.path().join("unknown.toml");
    std::fs::write(
        &unknown,
        "output_type = \"multiple_choice\"\ndata = \"mc.jsonl\"\ndoc_to_text = \"question\"\ndoc_to_choice = \"choices\"\ndoc_to_target = \"gold\"\nnum_fewshots = 2\n",
    )
    .unwrap();
    let error = run(&unknown);
    assert!(
        error.contains("unknown.toml") && error.contains("num_fewshots"),
        "{error}"
    );

    let missing = work.path().join("missing.toml");
    std::fs::write(
        &missing,
        "output_type = \"multiple_choice\"\ndata = \"mc.jsonl\"\ndoc_to_text = \"Q: {{questionn}}\"\ndoc_to_choice = \"choices\"\ndoc_to_target = \"gold\"\n",
    )
    .unwrap();
    let error = run(&missing);
    assert!(
        error.contains("mc.jsonl:1") && error.contains("doc_to_text"),
        "{error}"
    );

    let mut data = std::fs::read_to_string(work.path().join("mc.jsonl")).unwrap();
    data.push_str("{\"question\": \"broken\n");
    std::fs::write(work.path().join("broken.jsonl"), data).unwrap();
    let broken = work.path().join("broken.toml");
    std::fs::write(
        &broken,
        std::fs::read_to_string(work.path().join("mc.toml"))
            .unwrap()
            .replace("mc.jsonl", "broken.jsonl"),
    )
    .unwrap();
    let error = run(&broken);
    assert!(error.contains("broken.jsonl:13"), "{error}");

    // Nothing listens on this port (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let error = failure(&[
        "eval",
        "run",
        "--task",
        &work.path().join("mc.toml").display().to_string(),
        "--url",
        &url,
        "--tokenizer",
        &model,
        "--out",
        &out,
    ]);
    assert!(error.contains(&url), "{error}");

    // A server that accepts and never answers: the request times out, naming the URL.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming() {
            held.push(stream);
        }
    });
    let error = failure(&[
        "eval",
        "run",
        "--task",
        &work.path().join("mc.toml").display().to_string(),
        "--url",
        &silent_url,
        "--tokenizer",
        &model,
        "--timeout",
        "1",
        "--out",
        &out,
    ]);
    assert!(
        error.contains(&silent_url) && error.to_lowercase().contains("timed out"),
        "{error}"
    );

    // A server that answers every request with 500: the status and the URL are named.
    let failing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let failing_url = format!("http://{}", failing.local_addr().unwrap());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in failing.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 11\r\nConnection: close\r\n\r\nengine died",
            );
        }
    });
    let error = failure(&[
        "eval",
        "run",
        "--task",
        &work.path().join("mc.toml").display().to_string(),
        "--url",
        &failing_url,
        "--tokenizer",
        &model,
        "--out",
        &out,
    ]);
    assert!(
        error.contains(&failing_url) && error.contains("500") && error.contains("engine died"),
        "{error}"
    );
}

#[test]
fn a_checkpoint_series_is_evaluated_in_step_order() {
    let work = tempfile::tempdir().unwrap();
    write_tasks(work.path());
    let checkpoints = work.path().join("run/checkpoints");
    for step in ["step-00000020", "step-00000010"] {
        let model = checkpoints.join(step).join("model");
        std::fs::create_dir_all(&model).unwrap();
        for entry in std::fs::read_dir(fixture_dir()).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
        }
    }
    // A temporary (half-written) checkpoint is not a step.
    std::fs::create_dir_all(checkpoints.join(".tmp-step-00000030-1/model")).unwrap();
    let out = work.path().join("series");
    let out_str = out.display().to_string();
    let task = work.path().join("mc.toml").display().to_string();
    let checkpoints_str = checkpoints.display().to_string();
    ok(&[
        "eval",
        "run",
        "--task",
        &task,
        "--checkpoints",
        &checkpoints_str,
        "--out",
        &out_str,
    ]);
    let series: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("series.json")).unwrap()).unwrap();
    let steps: Vec<u64> = series.iter().map(|s| s["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [10, 20]);
    // The same weights at both steps: the same scores.
    assert_eq!(
        series[0]["results"][0]["metrics"],
        series[1]["results"][0]["metrics"]
    );
    assert!(out.join("step-00000010/mc/items.jsonl").is_file());
    // The report charts each metric across the steps with its confidence band and the random
    // baseline.
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    for expected in [
        "Task mc",
        "mc: acc (95% band)",
        "mc: acc_norm (95% band)",
        "random baseline",
    ] {
        assert!(report.contains(expected), "no {expected:?} in the report");
    }
    assert_eq!(report.matches("<svg").count(), 2);
    assert_eq!(report.matches("<polygon").count(), 2, "one band per chart");

    // The quality analysis reads the series: the same random weights at both steps make a
    // four-way task that is not above chance (1 / 4 from the results).
    let series_path = out.join("series.json").display().to_string();
    let analysis_path = out.join("quality.json");
    let printed = ok(&[
        "eval",
        "quality",
        "--series",
        &series_path,
        "--out",
        &analysis_path.display().to_string(),
        "--report",
        &out.join("quality").display().to_string(),
    ]);
    assert!(printed.starts_with("mc: "), "{printed}");
    let report = std::fs::read_to_string(out.join("quality/report.html")).unwrap();
    assert!(report.contains(printed.lines().next().unwrap().split(" (").next().unwrap()));
    assert!(report.contains("Task mc") && report.contains("<polygon"));
    let analysis: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&analysis_path).unwrap()).unwrap();
    assert_eq!(analysis[0]["checkpoints"], 2);
    assert_eq!(analysis[0]["random_baseline"], 0.25);
    let error = failure(&["eval", "quality", "--series", &task]);
    assert!(error.contains("mc.toml"), "{error}");
}

#[test]
fn contamination_finds_planted_items_and_scores_the_clean_subset() {
    let work = tempfile::tempdir().unwrap();
    write_tasks(work.path());
    // Items of 16 words each, none shared between items (13-grams need 13 words).
    let lines: String = (0..12)
        .map(|i| {
            let words: Vec<String> = (0..14).map(|k| format!("w{i}x{k}")).collect();
            format!(
                "{}\n",
                json!({"question": words.join(" "), "choices": ["yes", "no"], "gold": i % 2})
            )
        })
        .collect();
    std::fs::write(work.path().join("long.jsonl"), lines).unwrap();
    let task = work.path().join("long.toml");
    std::fs::write(
        &task,
        "output_type = \"multiple_choice\"\ndata = \"long.jsonl\"\n\
         doc_to_text = \"Q: {{question}}\\nA:\"\ndoc_to_choice = \"choices\"\n\
         doc_to_target = \"gold\"\n",
    )
    .unwrap();
    let model = fixture_dir().display().to_string();
    let out = work.path().join("out");
    let out_str = out.display().to_string();
    let task_str = task.display().to_string();
    ok(&[
        "eval", "run", "--task", &task_str, "--model", &model, "--out", &out_str,
    ]);
    // Items 2 and 5 (their text and answer) planted in training documents, in other case and
    // punctuation; the rest of the corpus unrelated.
    let planted = |i: usize| {
        let words: Vec<String> = (0..14).map(|k| format!("W{i}X{k}")).collect();
        format!("q -- {}?? A: {}!", words.join(", "), ["yes", "no"][i % 2])
    };
    let corpus = work.path().join("corpus.jsonl");
    std::fs::write(
        &corpus,
        format!(
            "{}\n{}\n{}\n",
            json!({"text": format!("Some other text. {} More text.", planted(2))}),
            json!({"text": "Shall I compare thee to a summer's day? Thou art more lovely."}),
            json!({"text": planted(5)}),
        ),
    )
    .unwrap();
    let report = work.path().join("report");
    let printed = ok(&[
        "eval",
        "contamination",
        "--task",
        &task_str,
        "--corpus",
        &corpus.display().to_string(),
        "--results",
        &out_str,
        "--out",
        &report.display().to_string(),
    ]);
    assert!(printed.contains("2 of 12 items contaminated"), "{printed}");
    assert!(printed.contains("clean (10 items)"), "{printed}");
    let json: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(report.join("contamination.json")).unwrap())
            .unwrap();
    assert_eq!(json[0]["report"]["contaminated"], json!([2, 5]));
    assert_eq!(json[0]["scores"]["clean_items"], 10);
    // A corpus file that does not parse is named with its line.
    std::fs::write(&corpus, "{\"text\": \"fine\"}\nnot json\n").unwrap();
    let error = failure(&[
        "eval",
        "contamination",
        "--task",
        &task_str,
        "--corpus",
        &corpus.display().to_string(),
        "--out",
        &report.display().to_string(),
    ]);
    assert!(error.contains("corpus.jsonl:2"), "{error}");
}
