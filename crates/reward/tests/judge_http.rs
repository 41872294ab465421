//! The judge's real HTTP path (`ureq`) against a tiny loopback stub of an OpenAI-compatible
//! server (one thread, port 0): the request it sends, model discovery, the bearer key, a dead
//! server retried past and then skipped, 5xx retried, 4xx not, and a slow server timed out.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stoke_reward::judge::{HttpTransport, JudgeConfig, JudgeTransport, JudgeVerifier};
use stoke_reward::{Outcome, Reference, RewardInput, Verifier};

/// One request the stub received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    authorization: Option<String>,
    body: Value,
}

type Reply = dyn Fn(&Seen) -> (u16, String, Duration) + Send + Sync;

/// Serves `reply` on a loopback port until the test process ends; returns the base URL and
/// the requests seen.
fn stub(
    reply: impl Fn(&Seen) -> (u16, String, Duration) + Send + Sync + 'static,
) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let reply: Box<Reply> = Box::new(reply);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = serve_one(stream, &reply, &log);
        }
    });
    (url, seen)
}

fn serve_one(stream: TcpStream, reply: &Reply, log: &Mutex<Vec<Seen>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let (mut length, mut authorization) = (0usize, None);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "authorization" => authorization = Some(value.trim().to_string()),
                _ => {}
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let seen = Seen {
        method,
        path,
        authorization,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    log.lock().unwrap().push(seen.clone());
    let (status, text, delay) = reply(&seen);
    std::thread::sleep(delay);
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )?;
    stream.flush()
}

/// A chat completion answer with `content`.
fn chat(content: &str) -> String {
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
        .to_string()
}

/// A judge that answers every chat with `content` and lists one model, `served`.
fn answering(content: &'static str) -> (String, Arc<Mutex<Vec<Seen>>>) {
    stub(move |seen| {
        if seen.path == "/v1/models" {
            (
                200,
                json!({"data": [{"id": "served"}]}).to_string(),
                Duration::ZERO,
            )
        } else {
            (200, chat(content), Duration::ZERO)
        }
    })
}

/// A port nobody listens on.
fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

fn judge(urls: &[&str], extra: &str) -> JudgeVerifier {
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    let text = format!(
        "urls = [{}]\nrubric = \"Be correct.\"\ncache_size = 0\n{extra}",
        urls.join(", ")
    );
    let config: JudgeConfig = toml::from_str(&text).unwrap();
    JudgeVerifier::new(&config).unwrap()
}

fn score(judge: &JudgeVerifier, completion: &str) -> stoke_reward::RewardOutcome {
    let reference = Reference::default();
    judge.score(&RewardInput::new("What is 2 + 2?", completion, &reference))
}

#[test]
fn a_pointwise_judgement_goes_over_http_with_the_discovered_model() {
    let (url, seen) = answering("The answer is right.\n**Score:** 8");
    let judge = judge(&[&url], "max_tokens = 64");
    let outcome = score(&judge, "4");
    assert_eq!(outcome.outcome, Outcome::Shaped, "{outcome:?}");
    assert!((outcome.score - 7.0 / 9.0).abs() < 1e-12);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("GET", "/v1/models")
    );
    assert_eq!(
        (seen[1].method.as_str(), seen[1].path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    let body = &seen[1].body;
    assert_eq!(body["model"], "served");
    assert_eq!(body["max_tokens"], 64);
    assert_eq!(body["messages"][0]["role"], "system");
    assert!(
        body["messages"][1]["content"]
            .as_str()
            .unwrap()
            .contains("\n4\n")
    );
    assert_eq!(seen[1].authorization, None);
}

#[test]
fn the_api_key_is_sent_as_a_bearer_token() {
    let (url, seen) = answering("Score: 5");
    let transport = HttpTransport::new(Some("sk-test".into()));
    let text = transport
        .chat(
            &url,
            &json!({"model": "m", "messages": []}),
            Duration::from_secs(5),
        )
        .unwrap();
    assert_eq!(text, "Score: 5");
    assert_eq!(
        seen.lock().unwrap()[0].authorization.as_deref(),
        Some("Bearer sk-test")
    );
}

#[test]
fn a_dead_server_is_retried_past_then_skipped() {
    let dead = dead_url();
    let (live, seen) = answering("Score: 10");
    let judge = judge(&[&dead, &live], "model = \"m\"\nretries = 1");
    let first = score(&judge, "4");
    assert_eq!(first.outcome, Outcome::Shaped, "{first:?}");
    assert_eq!(first.score, 1.0);
    let figures = first.details.judge.unwrap();
    assert_eq!((figures.calls, figures.retries), (1, 1));
    // The dead server cools down: the next requests go straight to the live one.
    let started = Instant::now();
    let mut skipped = 0;
    for _ in 0..4 {
        let outcome = score(&judge, "4");
        let figures = outcome.details.judge.unwrap();
        assert_eq!((outcome.outcome, figures.retries), (Outcome::Shaped, 0));
        skipped += figures.servers_skipped;
    }
    assert!(skipped >= 2, "the dead server was passed over ({skipped})");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(seen.lock().unwrap().len(), 5);
}

#[test]
fn server_errors_are_retried_and_client_errors_are_not() {
    let (busy, busy_seen) = stub(|_| (503, "{\"error\": \"overloaded\"}".into(), Duration::ZERO));
    let (live, _) = answering("Score: 1");
    let outcome = score(&judge(&[&busy, &live], "model = \"m\""), "4");
    assert_eq!(outcome.outcome, Outcome::Shaped, "{outcome:?}");
    assert_eq!(outcome.score, 0.0, "a real score of 0, not a failure");
    assert_eq!(busy_seen.lock().unwrap().len(), 1);

    let (wrong, wrong_seen) =
        stub(|_| (400, "{\"error\": \"unknown model\"}".into(), Duration::ZERO));
    let outcome = score(&judge(&[&wrong, &live], "model = \"m\"\nretries = 3"), "4");
    assert_eq!(outcome.outcome, Outcome::ScorerError);
    assert!(
        outcome
            .details
            .reason
            .as_deref()
            .unwrap()
            .contains("unknown model")
    );
    assert_eq!(wrong_seen.lock().unwrap().len(), 1);
}

#[test]
fn a_slow_server_times_out_into_a_scorer_error() {
    let (slow, _) = stub(|_| (200, chat("Score: 9"), Duration::from_secs(3)));
    let started = Instant::now();
    let outcome = score(
        &judge(&[&slow], "model = \"m\"\ntimeout_s = 0.3\nretries = 1"),
        "4",
    );
    assert_eq!(outcome.outcome, Outcome::ScorerError, "{outcome:?}");
    assert!(
        outcome
            .details
            .reason
            .as_deref()
            .unwrap()
            .contains("2 attempt")
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn pairwise_over_http_ranks_the_group() {
    // The stub prefers the response quoted first unless B holds the digit 4.
    let (url, _) = stub(|seen| {
        let user = seen.body["messages"][1]["content"]
            .as_str()
            .unwrap_or_default();
        let b = user.split("<response-B-").nth(1).unwrap_or_default();
        let verdict = if b.contains("\n4\n") { "B" } else { "A" };
        (200, chat(&format!("Verdict: {verdict}")), Duration::ZERO)
    });
    let judge = judge(&[&url], "model = \"m\"\nmode = \"pairwise\"");
    let reference = Reference::default();
    let inputs: Vec<RewardInput<'_>> = ["4", "5", "22"]
        .iter()
        .map(|c| RewardInput::new("What is 2 + 2?", c, &reference))
        .collect();
    let out = judge.score_group(&inputs);
    assert!(out.iter().all(|o| o.outcome == Outcome::Shaped), "{out:?}");
    assert!(
        out[0].score > out[1].score && out[0].score > out[2].score,
        "{out:?}"
    );
}
