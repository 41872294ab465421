//! One OpenAI-compatible inference server as a [`TurnEngine`], with no weight publication:
//! episodes played against a model someone else serves (`stoke env --endpoint`).
//!
//! What it is: the remote rollout's request and checks (`rollout.rs`: token ids in, ids and
//! processed log-probs out, `n` choices, ids inside the vocabulary, finite log-probs) against a
//! single server that is checked once (it answers, serves the model, tokenizes as the local
//! tokenizer does), so the transcript's ids are the sampled ones and the masks are exact. The
//! server is `stoke serve` (each turn draws the stream the in-process engine draws: the group,
//! the episode and the turn are sent) or vLLM (a seed mixed from the same key). What it is not:
//! a pool (one server, no retries: a failed request ends the call with the server's answer) or a
//! weight publisher (the server keeps whatever weights it has; their versions are reported as
//! they are, 0 for a server that reports none).

use stoke_serve::client::Client;
use stoke_tokenizer::hf::Tokenizer;

use crate::episode::TurnEngine;
use crate::error::PipelineError;
use crate::remote::rollout::{
    check_server, completion_body, live_generation, post_completion, request_keys,
};
use crate::rollout::check_prompt;
use crate::scheduler::each_on_a_thread;
use crate::settings::{Engine, PoolSettings, Routing};
use stoke_rollout::{GenerationRequest, LiveGeneration};

/// One server, checked (see the module doc).
pub struct Endpoint {
    client: Client,
    url: String,
    model_name: String,
    engine: Engine,
    vocab_size: usize,
    max_model_len: usize,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url)
            .field("model", &self.model_name)
            .field("engine", &self.engine.name())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Checks the server at `url` (it answers within `timeout`, serves `model` or, when `None`,
    /// its first model, and tokenizes a probe as `tokenizer` does) and finds its engine when
    /// `engine` is `None` (`stoke serve` answers `/weights/checksum`; anything else is taken as
    /// vLLM, which speaks the same request with a seed). `vocab_size` and `max_positions` are
    /// the local model's; the server's `max_model_len`, when it reports one, can only shorten
    /// the context. Errors name the URL and what failed.
    pub fn connect(
        url: &str,
        model: Option<String>,
        engine: Option<Engine>,
        tokenizer: &Tokenizer,
        vocab_size: usize,
        max_positions: usize,
        timeout: std::time::Duration,
    ) -> Result<Endpoint, PipelineError> {
        let url = url.trim_end_matches('/').to_string();
        let pool = PoolSettings {
            servers: vec![url.clone()],
            routing: Routing::LeastLoaded,
            max_in_flight: 1,
            timeout,
            revive_after: timeout,
            startup_wait: std::time::Duration::ZERO,
        };
        let mut model_name = model;
        let checked = check_server("endpoint", &url, &pool, &mut model_name, tokenizer)?;
        let engine = match engine {
            Some(engine) => engine,
            None => match checked.client.get("/weights/checksum") {
                Ok((200, answer)) if answer["version"].is_u64() => Engine::Stoke,
                _ => Engine::Vllm,
            },
        };
        Ok(Endpoint {
            max_model_len: checked
                .max_model_len
                .unwrap_or(max_positions)
                .min(max_positions),
            client: checked.client,
            url,
            model_name: model_name.unwrap_or_default(),
            engine,
            vocab_size,
        })
    }

    /// The served model's name, as requests send it.
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// The server software found (or given).
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The longest prompt and completion the server continues.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }
}

impl TurnEngine for Endpoint {
    fn max_positions(&self) -> Result<usize, PipelineError> {
        Ok(self.max_model_len)
    }

    fn generate(&self, request: &GenerationRequest) -> Result<LiveGeneration, PipelineError> {
        let keys = request_keys(request);
        let work: Vec<_> = request.prompts.iter().zip(keys).collect();
        let answers = each_on_a_thread(&work, |&(prompt, key)| {
            let refuse = |reason: String| PipelineError::Remote {
                service: "endpoint",
                reason: format!(
                    "{}: group {} episode {} turn {}: {reason}",
                    self.url, key.prompt_number, key.first_sample, key.turn
                ),
            };
            check_prompt(
                prompt,
                self.vocab_size,
                self.max_model_len,
                "the server's max_model_len",
            )
            .map_err(refuse)?;
            let body = completion_body(
                &self.model_name,
                self.engine,
                prompt,
                key,
                &request.params,
                self.max_model_len,
            );
            post_completion(
                &self.client,
                &body,
                request.params.n.max(1),
                0,
                0,
                Some(0),
                self.vocab_size,
            )
            .map_err(refuse)
        });
        live_generation(request, answers)
    }
}
