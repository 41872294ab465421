//! `/v1/completions` against the engine and the scorer on the tiny Qwen2 fixture: greedy and
//! seeded completions equal `Engine::generate` (what `stoke generate` runs) token for token,
//! echoed prompt log-probs and raw generated log-probs equal `stoke score`'s within 1e-5, and
//! every field of the vLLM answer (logprobs, prompt_logprobs, token ids, stop reasons, n,
//! several prompts, streaming) has the shape and values it promises.

mod common;

use candle_core::Device;
use common::*;
use serde_json::{Value, json};
use stoke_rollout::engine::Engine;
use stoke_rollout::score::next_token_logprobs;
use stoke_rollout::{GenerationRequest, SamplingParams};
use stoke_tokenizer::hf::Tokenizer;

const PROMPT: [u32; 6] = [40, 7, 101, 33, 250, 12];

fn engine_tokens(
    prompt: &[u32],
    max_new: usize,
    temperature: f32,
    seed: u64,
    n: usize,
) -> Vec<Vec<u32>> {
    let model = load_fixture();
    let tokenizer = Tokenizer::from_dir(&fixture_dir()).unwrap();
    let mut stop_token_ids = model.config().eos_token_ids.clone();
    stop_token_ids.extend(tokenizer.eos_token_ids());
    let params = SamplingParams {
        max_new_tokens: max_new,
        temperature,
        top_k: None,
        top_p: 1.0,
        seed,
        n,
        stop_token_ids,
        stop_strings: Vec::new(),
    };
    let output = Engine::new(&model)
        .generate(&GenerationRequest::new(vec![prompt.to_vec()], params), None)
        .unwrap();
    output.completions[0]
        .iter()
        .map(|c| c.token_ids.clone())
        .collect()
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("an id list")
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn greedy_and_seeded_completions_equal_the_engine() {
    let (server, client) = start_default();
    let answer = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 20, "return_token_ids": true}),
    );
    let want = engine_tokens(&PROMPT, 20, 0.0, 0, 1);
    assert_eq!(ids(&answer["choices"][0]["token_ids"]), want[0]);
    let answer = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 20, "temperature": 1.0, "seed": 77, "n": 3, "return_token_ids": true}),
    );
    let want = engine_tokens(&PROMPT, 20, 1.0, 77, 3);
    for (index, tokens) in want.iter().enumerate() {
        let choice = &answer["choices"][index];
        assert_eq!(choice["index"], index);
        assert_eq!(&ids(&choice["token_ids"]), tokens);
    }
    server.stop();
}

#[test]
fn echoed_prompt_logprobs_and_raw_token_logprobs_equal_the_scorer() {
    let (server, client) = start_default();
    let model = load_fixture();
    // lm-eval's log-likelihood request: echo, one token, logprobs 1.
    let answer = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 1, "logprobs": 1, "echo": true, "seed": 1234}),
    );
    let logprobs = &answer["choices"][0]["logprobs"];
    let token_logprobs = logprobs["token_logprobs"].as_array().unwrap();
    assert_eq!(token_logprobs.len(), PROMPT.len() + 1);
    assert!(token_logprobs[0].is_null());
    assert!(logprobs["top_logprobs"][0].is_null());
    let scores = next_token_logprobs(&model, &PROMPT, &Device::Cpu).unwrap();
    for (i, want) in scores.iter().enumerate() {
        let got = token_logprobs[i + 1].as_f64().unwrap() as f32;
        assert!(
            (got - want).abs() <= 1e-5,
            "token {}: {got} vs {want}",
            i + 1
        );
        // The token itself is among its top entries.
        assert!(logprobs["top_logprobs"][i + 1].as_object().unwrap().len() <= 2);
    }
    assert_eq!(
        logprobs["tokens"].as_array().unwrap().len(),
        PROMPT.len() + 1
    );
    let offsets = logprobs["text_offset"].as_array().unwrap();
    assert!(offsets.windows(2).all(|w| w[0].as_u64() <= w[1].as_u64()));

    // Raw log-probs of sampled tokens equal the scorer's on prompt + completion.
    let answer = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 10, "temperature": 0.6, "top_k": 50, "seed": 5, "logprobs": 0,
               "logprobs_mode": "raw_logprobs", "return_token_ids": true, "ignore_eos": true}),
    );
    let choice = &answer["choices"][0];
    let generated = ids(&choice["token_ids"]);
    let mut sequence = PROMPT.to_vec();
    sequence.extend(&generated);
    let scores = next_token_logprobs(&model, &sequence, &Device::Cpu).unwrap();
    for (t, got) in choice["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let want = scores[PROMPT.len() - 1 + t];
        let got = got.as_f64().unwrap() as f32;
        assert!(
            (got - want).abs() <= 1e-5,
            "generated token {t}: {got} vs {want}"
        );
    }
    // Processed log-probs are those of the tempered, truncated distribution: larger here.
    let processed = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 10, "temperature": 0.6, "top_k": 50, "seed": 5, "logprobs": 0,
               "return_token_ids": true, "ignore_eos": true}),
    );
    assert_eq!(ids(&processed["choices"][0]["token_ids"]), generated);
    let sum = |v: &Value| -> f64 {
        v["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .sum()
    };
    assert!(sum(&processed) > sum(&answer));
    server.stop();
}

#[test]
fn max_tokens_zero_with_echo_scores_the_prompt_only() {
    let (server, client) = start_default();
    let answer = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 0, "echo": true, "logprobs": 2}),
    );
    let choice = &answer["choices"][0];
    assert_eq!(
        choice["logprobs"]["tokens"].as_array().unwrap().len(),
        PROMPT.len()
    );
    assert_eq!(answer["usage"]["completion_tokens"], 0);
    assert_eq!(choice["finish_reason"], "length");
    // Top-2 alternatives plus the token itself at most.
    for top in choice["logprobs"]["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .skip(1)
    {
        let entries = top.as_object().unwrap().len();
        assert!((2..=3).contains(&entries), "{top}");
    }
    server.stop();
}

#[test]
fn prompt_logprobs_token_ids_and_token_strings_follow_vllm() {
    let (server, client) = start_default();
    let answer = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 3, "prompt_logprobs": 2, "logprobs": 1,
               "return_token_ids": true, "return_tokens_as_token_ids": true}),
    );
    let choice = &answer["choices"][0];
    assert_eq!(ids(&choice["prompt_token_ids"]), PROMPT);
    let prompt_logprobs = choice["prompt_logprobs"].as_array().unwrap();
    assert_eq!(prompt_logprobs.len(), PROMPT.len());
    assert!(prompt_logprobs[0].is_null());
    for (position, entry) in prompt_logprobs.iter().enumerate().skip(1) {
        let map = entry.as_object().unwrap();
        let actual = &map[&PROMPT[position].to_string()];
        assert!(actual["logprob"].as_f64().unwrap() <= 0.0);
        assert!(actual["rank"].as_u64().unwrap() >= 1);
        assert_eq!(
            actual["decoded_token"],
            format!("token_id:{}", PROMPT[position])
        );
        assert!((1..=3).contains(&map.len()));
    }
    let tokens = choice["logprobs"]["tokens"].as_array().unwrap();
    let token_ids = ids(&choice["token_ids"]);
    for (token, id) in tokens.iter().zip(&token_ids) {
        assert_eq!(token, &json!(format!("token_id:{id}")));
    }
    assert_eq!(choice["weight_versions"], json!([0, 0, 0]));
    server.stop();
}

#[test]
fn several_prompts_and_n_give_prompt_major_choices_and_usage() {
    let (server, client) = start_default();
    let answer = ok(
        &client,
        "/v1/completions",
        json!({"prompt": [[1, 2, 3], [4, 5, 6, 7]], "max_tokens": 4, "n": 2, "temperature": 1.0,
               "seed": 3, "ignore_eos": true, "return_token_ids": true}),
    );
    let choices = answer["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (index, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], index);
        assert_eq!(choice["finish_reason"], "length");
    }
    assert_eq!(ids(&choices[2]["prompt_token_ids"]), vec![4, 5, 6, 7]);
    assert_eq!(answer["usage"]["prompt_tokens"], 7);
    assert_eq!(answer["usage"]["completion_tokens"], 16);
    assert_eq!(answer["usage"]["total_tokens"], 23);
    assert_eq!(answer["object"], "text_completion");
    assert_eq!(answer["model"], "tiny");
    assert!(answer["id"].as_str().unwrap().starts_with("cmpl-"));
    // Text prompts are tokenized by the model's tokenizer.
    let answer = ok(
        &client,
        "/v1/completions",
        json!({"prompt": ["Hello world", "abc"], "max_tokens": 2, "echo": true}),
    );
    assert!(
        answer["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("Hello world")
    );
    assert!(
        answer["choices"][1]["text"]
            .as_str()
            .unwrap()
            .starts_with("abc")
    );
    server.stop();
}

#[test]
fn stop_strings_cut_the_text_and_name_the_stop_reason() {
    let (server, client) = start_default();
    let free = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 40, "ignore_eos": true}),
    );
    let text = free["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(
        chars.len() >= 12,
        "the fixture should write some text: {text:?}"
    );
    let stop: String = chars[8..10].iter().collect();
    let first = text.find(&stop).unwrap();
    let cut = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 40, "ignore_eos": true, "stop": [stop.clone()]}),
    );
    let choice = &cut["choices"][0];
    assert_eq!(choice["text"], text[..first]);
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["stop_reason"], stop);
    // Streamed, the stop string never shows and the pieces add up to the same text.
    let events = stream(
        &client,
        "/v1/completions",
        json!({"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": true,
               "stop": stop, "stream": true}),
    );
    let streamed: String = events
        .iter()
        .map(|e| e["choices"][0]["text"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(streamed, text[..first]);
    let last = events.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    // A stop token id the user named is the stop reason.
    let free_ids = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 10, "ignore_eos": true, "return_token_ids": true}),
    );
    let free_ids = ids(&free_ids["choices"][0]["token_ids"]);
    let third = free_ids[2];
    let first_at = free_ids.iter().position(|&id| id == third).unwrap();
    let stopped = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 10, "stop_token_ids": [third], "ignore_eos": true}),
    );
    assert_eq!(stopped["choices"][0]["stop_reason"], third);
    assert_eq!(stopped["usage"]["completion_tokens"], first_at + 1);
    server.stop();
}

#[test]
fn streamed_completions_add_up_to_the_whole_answer() {
    let (server, client) = start_default();
    let whole = complete(
        &client,
        &PROMPT,
        json!({"max_tokens": 16, "n": 2, "temperature": 1.0, "seed": 9, "logprobs": 2, "echo": true}),
    );
    let events = stream(
        &client,
        "/v1/completions",
        json!({"prompt": PROMPT, "max_tokens": 16, "n": 2, "temperature": 1.0, "seed": 9,
               "logprobs": 2, "echo": true, "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    for index in 0..2 {
        let chunks: Vec<&Value> = events
            .iter()
            .flat_map(|e| e["choices"].as_array().unwrap())
            .filter(|c| c["index"] == index)
            .collect();
        let text: String = chunks.iter().map(|c| c["text"].as_str().unwrap()).collect();
        assert_eq!(text, whole["choices"][index]["text"].as_str().unwrap());
        let logprobs: Vec<Value> = chunks
            .iter()
            .filter(|c| !c["logprobs"].is_null())
            .flat_map(|c| c["logprobs"]["token_logprobs"].as_array().unwrap().clone())
            .collect();
        assert_eq!(
            logprobs,
            whole["choices"][index]["logprobs"]["token_logprobs"]
                .as_array()
                .unwrap()
                .clone()
        );
        let finish: Vec<&Value> = chunks
            .iter()
            .map(|c| &c["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, vec![&whole["choices"][index]["finish_reason"]]);
    }
    let usage = events.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], whole["usage"]);
    server.stop();
}
