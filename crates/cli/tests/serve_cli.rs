//! `stoke serve` and `stoke chat` as the built binary on the tiny Qwen2 fixture: the server
//! prints where it listens, its greedy completions equal `stoke generate`'s token for token, its
//! echoed log-probs equal `stoke score`'s within 1e-5, it stops cleanly on SIGINT; `stoke chat`
//! streams replies from a local model and from a URL, and ends at end of input.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use stoke_serve::Client;

mod server;

use server::{Server, fixture_dir};

fn stoke_json(args: &[&str]) -> Vec<Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_stoke"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn served_completions_equal_generate_and_score() {
    let server = Server::start();
    let client = Client::new(&server.url);
    let model = fixture_dir().display().to_string();
    let prompt = [17u32, 3, 250, 41, 9];
    let ids = "17,3,250,41,9";
    let generated = stoke_json(&[
        "generate",
        "--model",
        &model,
        "--prompt-ids",
        ids,
        "--temperature",
        "0",
        "--max-tokens",
        "24",
    ]);
    let (status, answer) = client
        .post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "return_token_ids": true}),
        )
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["token_ids"], generated[0]["token_ids"]);

    let scored = stoke_json(&["score", "--model", &model, "--ids", ids]);
    let (_, echoed) = client
        .post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 0}),
        )
        .unwrap();
    let want = scored[0]["next_token_logprobs"].as_array().unwrap();
    let got = echoed["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(got.len(), want.len() + 1);
    for (i, want) in want.iter().enumerate() {
        let (got, want) = (got[i + 1].as_f64().unwrap(), want.as_f64().unwrap());
        assert!(
            (got - want).abs() <= 1e-5,
            "token {}: {got} vs {want}",
            i + 1
        );
    }
    server.stop();
}

fn chat(args: &[&str], input: &str) -> (String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_stoke"))
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "{stderr}");
    (String::from_utf8_lossy(&output.stdout).to_string(), stderr)
}

#[test]
fn chat_streams_replies_from_a_local_model_and_from_a_server() {
    let model = fixture_dir().display().to_string();
    let (stdout, stderr) = chat(
        &["--model", &model, "--max-tokens", "8", "--temperature", "0"],
        "Hello\n/reset\nHi again\n",
    );
    assert!(stderr.contains("chatting with qwen2_bias_tied"), "{stderr}");
    assert!(stderr.contains("(conversation cleared)"), "{stderr}");

    let server = Server::start();
    let (remote, stderr) = chat(
        &[
            "--url",
            &server.url,
            "--max-tokens",
            "8",
            "--temperature",
            "0",
        ],
        "Hello\n/exit\nnot read\n",
    );
    assert!(stderr.contains("chatting with tiny"), "{stderr}");
    // Greedy: the same reply as the local model's first one; the second message was not read.
    assert!(remote.ends_with('\n') && remote.len() > 1, "{remote:?}");
    assert!(stdout.starts_with(&remote), "{stdout:?} vs {remote:?}");
    assert!(stdout.len() > remote.len());
    server.stop();
}

#[test]
fn serve_help_says_the_model_may_be_a_folder_or_a_gguf_file() {
    let output = Command::new(env!("CARGO_BIN_EXE_stoke"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let model = help
        .lines()
        .skip_while(|line| !line.trim_start().starts_with("--model"))
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        model.contains("folder") && model.contains("GGUF file"),
        "--model's help: {model:?}"
    );
}

#[test]
fn a_reward_model_is_served_over_classify_with_transformers_scores() {
    let rm = fixture_dir().join("../llama_reward_model");
    // Asked to generate, a classifier is refused at start-up, named.
    let output = Command::new(env!("CARGO_BIN_EXE_stoke"))
        .args(["serve", "--task", "generate", "--model"])
        .arg(&rm)
        .args(["--port", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("llama_reward_model") && stderr.contains("--task reward"),
        "{stderr}"
    );
    // A causal LM asked to score is refused too.
    let output = Command::new(env!("CARGO_BIN_EXE_stoke"))
        .args(["serve", "--task", "reward", "--model"])
        .arg(fixture_dir())
        .args(["--port", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("not a sequence classifier"),
        "{stderr}"
    );

    // `--task auto` (the default) serves the classifier's scores.
    let mut command = Command::new(env!("CARGO_BIN_EXE_stoke"));
    command
        .args(["serve", "--served-model-name", "rm", "--model"])
        .arg(&rm)
        .args(["--port", "0"])
        .stdout(Stdio::null());
    let server = Server::spawn(command);
    let client = Client::new(&server.url);
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_dir().join("../../reward_model/trl_reward.json")).unwrap(),
    )
    .unwrap();
    let rows = &fixture["scores"]["rows"];
    let expected: Vec<f64> = fixture["scores"]["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l[0].as_f64().unwrap())
        .collect();
    // Raw logits: transformers' `LlamaForSequenceClassification` on the same ids (a row with
    // right padding is scored at its last non-pad token).
    for path in ["/classify", "/v1/classify"] {
        let (status, answer) = client
            .post(
                path,
                &json!({"model": "rm", "input": rows, "use_activation": false}),
            )
            .unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["object"], "list");
        let data = answer["data"].as_array().unwrap();
        assert_eq!(data.len(), expected.len());
        for (i, (d, want)) in data.iter().zip(&expected).enumerate() {
            assert_eq!(d["index"], i);
            assert_eq!(d["num_classes"], 1);
            let got = d["probs"][0].as_f64().unwrap();
            assert!(
                (got - want).abs() < 1e-4,
                "row {i}: {got} vs transformers {want}"
            );
        }
    }
    // vLLM's default activation for one label is the sigmoid; /pooling gives the raw logits.
    let (status, answer) = client
        .post("/classify", &json!({"input": rows[1]}))
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    let sigmoid = 1.0 / (1.0 + (-expected[1]).exp());
    assert!((answer["data"][0]["probs"][0].as_f64().unwrap() - sigmoid).abs() < 1e-4);
    assert_eq!(answer["data"].as_array().unwrap().len(), 1, "{answer}");
    let (status, answer) = client.post("/pooling", &json!({"input": rows})).unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["data"][4]["object"], "pooling");
    assert!((answer["data"][4]["data"][0].as_f64().unwrap() - expected[4]).abs() < 1e-4);

    // Bad requests get a 400 naming the field, and the server keeps serving.
    let long: Vec<u32> = vec![1; 10_000];
    for (body, field) in [
        (json!({"model": "other", "input": [[1, 2]]}), "model"),
        (json!({"input": [[1, 2], [1, 100000]]}), "input[1]"),
        (json!({"input": [[1, 2], []]}), "input[1]"),
        (json!({"input": [long]}), "input[0]"),
        (json!({"input": "text"}), "input"),
        (json!({"input": [[1], {"a": 1}]}), "input[1]"),
        (
            json!({"input": [[1]], "truncate_prompt_tokens": 0}),
            "truncate_prompt_tokens",
        ),
        (json!({}), "input"),
    ] {
        let (status, answer) = client.post("/classify", &body).unwrap();
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], field, "{body}: {answer}");
    }
    // A too-long row is cut to its last ids when asked.
    let (status, answer) = client
        .post(
            "/classify",
            &json!({"input": [long], "truncate_prompt_tokens": -1}),
        )
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = client.get("/v1/completions").unwrap();
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/classify"),
        "{answer}"
    );
    let (status, models) = client.get("/v1/models").unwrap();
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "rm");
    server.stop();
}
