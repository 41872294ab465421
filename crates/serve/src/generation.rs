//! One API request in flight: its prompts submitted to the worker, and the events that come back
//! folded into choices (one per prompt x sample), for the completions and chat routes alike.
//!
//! What it is: [`Generation::start`] (queue bound, submission), [`Generation::next`] (one event
//! applied to its choice, with the text a stream may send now) and the text rules shared by
//! streaming and non-streaming answers. What it is not: response JSON (`completions.rs`,
//! `chat.rs`).
//!
//! Text invariants:
//! - a choice's final text is `StopCriteria::final_text`: special tokens skipped (unless the
//!   request says otherwise), the end-of-sequence token left out, cut before a stop string;
//! - streamed text is always a prefix of the final text: while a sample runs, the last
//!   `longest stop string - 1` characters are held back (they might start a stop string), and
//!   with a tool-call parser everything from where a call may start on
//!   (`ToolCallParser::call_start`: its marker, or a partial marker at the end); once the sample
//!   ends, the text before the parsed calls is released (all of it when none parse).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use stoke_rollout::{
    BatchEvent, BatchRequest, Detokenizer, FinishReason, StopCriteria, TokenLogprob,
};
use stoke_tokenizer::hf::{DecodeStream, Tokenizer};
use stoke_tokenizer::tool_calls::ToolCallParser;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::sync::oneshot;

use crate::app::App;
use crate::error::ApiError;
use crate::protocol::GenerationSpec;
use crate::worker::{ChannelSink, Command};

/// One sample of one prompt.
#[derive(Debug)]
pub struct Choice {
    pub index: usize,
    pub prompt: usize,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub versions: Vec<u64>,
    pub finish: Option<FinishReason>,
    /// Streaming: the decoded text so far and how many bytes of it were sent.
    decoder: DecodeStream,
    decoded: String,
    sent: usize,
    last_token_at: Option<Instant>,
}

/// What one event changed, for a stream.
#[derive(Debug)]
pub enum Update {
    /// Prompt `prompt` is prefilled (its log-probs are in `Generation::prompt_logprobs`).
    Prefilled { prompt: usize },
    /// Choice `choice` got a token (`token` indexes `logprobs`); `text` is what may be sent now;
    /// `finished` when it was the choice's last.
    Token {
        choice: usize,
        token: usize,
        text: String,
        finished: bool,
    },
}

/// A request in flight.
pub struct Generation {
    pub spec: GenerationSpec,
    pub choices: Vec<Choice>,
    pub prompt_logprobs: Vec<Option<Vec<Option<TokenLogprob>>>>,
    pub arrived: Instant,
    pub first_token_at: Option<Instant>,
    /// Parse tool calls out of the text (chat with tools): hold back from a possible call on.
    pub tool_parser: Option<ToolCallParser>,
    app: Arc<App>,
    events: UnboundedReceiver<(usize, BatchEvent)>,
    stop: StopCriteria,
    holdback_chars: usize,
    /// Prompts not yet prefilled (counted in the app's queue).
    queued: usize,
    finished: usize,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("choices", &self.choices.len())
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // Prompts that never started leave the queue with the request.
        self.app.queued.fetch_sub(self.queued, Ordering::AcqRel);
    }
}

/// The detokenizer of a request: special tokens skipped or kept.
struct TextOf<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
}

impl Detokenizer for TextOf<'_> {
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        let known: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| self.tokenizer.id_to_token(id).is_some())
            .collect();
        self.tokenizer
            .decode(&known, self.skip_special_tokens)
            .map_err(|e| e.to_string())
    }
}

impl Generation {
    /// Queues `spec`'s prompts (429 when the queue is full).
    pub async fn start(
        app: Arc<App>,
        spec: GenerationSpec,
        tool_parser: Option<ToolCallParser>,
    ) -> Result<Generation, ApiError> {
        let arrived = Instant::now();
        let prompts = spec.prompts.len();
        let queued_before = app.queued.fetch_add(prompts, Ordering::AcqRel);
        if queued_before + prompts > app.config.max_queue.max(prompts) {
            app.queued.fetch_sub(prompts, Ordering::AcqRel);
            return Err(ApiError::overloaded(format!(
                "the server's queue is full ({} requests waiting); retry later",
                queued_before
            )));
        }
        let stop = StopCriteria::new(
            spec.params.stop_token_ids.clone(),
            spec.params.stop_strings.clone(),
            spec.params.max_new_tokens,
            true,
        )
        .map_err(ApiError::from)?;
        let (sender, events) = unbounded_channel();
        let requests = spec
            .prompts
            .iter()
            .enumerate()
            .map(|(index, prompt)| {
                (
                    BatchRequest {
                        prompt_ids: prompt.ids.clone(),
                        params: spec.params.clone(),
                        prompt_number: spec.first_prompt_number + index as u64,
                        first_sample: spec.first_sample,
                        turn: spec.turn,
                        logprobs: spec.logprobs,
                    },
                    ChannelSink {
                        prompt: index,
                        events: sender.clone(),
                    },
                )
            })
            .collect();
        drop(sender);
        let n = spec.params.n;
        let choices = (0..prompts * n)
            .map(|index| Choice {
                index,
                prompt: index / n,
                token_ids: Vec::new(),
                logprobs: Vec::new(),
                versions: Vec::new(),
                finish: None,
                decoder: DecodeStream::new(spec.skip_special_tokens),
                decoded: String::new(),
                sent: 0,
                last_token_at: None,
            })
            .collect();
        let holdback_chars = spec
            .params
            .stop_strings
            .iter()
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        let generation = Generation {
            prompt_logprobs: vec![None; prompts],
            spec,
            choices,
            arrived,
            first_token_at: None,
            tool_parser,
            app: Arc::clone(&app),
            events,
            stop,
            holdback_chars,
            queued: prompts,
            finished: 0,
        };
        let (reply, answer) = oneshot::channel();
        if !app.worker.send(Command::Submit { requests, reply }) {
            return Err(ApiError::internal("the generation worker has stopped"));
        }
        match answer.await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Err(ApiError::from(error)),
            Err(_) => return Err(ApiError::internal("the generation worker has stopped")),
        }
        let prompt_tokens: usize = generation.spec.prompts.iter().map(|p| p.ids.len()).sum();
        app.metrics.prompt_tokens.inc_by(prompt_tokens as u64);
        Ok(generation)
    }

    pub fn is_done(&self) -> bool {
        self.finished == self.choices.len()
    }

    /// Waits for the next event and applies it. `Ok(None)` when every choice has finished.
    pub async fn next(&mut self) -> Result<Option<Update>, ApiError> {
        if self.is_done() {
            return Ok(None);
        }
        let Some((prompt, event)) = self.events.recv().await else {
            return Err(ApiError::internal(
                "the generation worker dropped the request",
            ));
        };
        match event {
            BatchEvent::Prefilled { prompt_logprobs } => {
                self.prompt_logprobs[prompt] = prompt_logprobs;
                self.queued -= 1;
                self.app.queued.fetch_sub(1, Ordering::AcqRel);
                Ok(Some(Update::Prefilled { prompt }))
            }
            BatchEvent::Token {
                sample,
                token,
                version,
            } => {
                let now = Instant::now();
                let metrics = &self.app.metrics;
                if self.first_token_at.is_none() {
                    self.first_token_at = Some(now);
                    metrics
                        .time_to_first_token
                        .observe((now - self.arrived).as_secs_f64());
                }
                metrics.generation_tokens.inc();
                let index = prompt * self.spec.params.n + sample;
                let choice = &mut self.choices[index];
                if let Some(previous) = choice.last_token_at {
                    metrics
                        .inter_token_latency
                        .observe((now - previous).as_secs_f64());
                }
                choice.last_token_at = Some(now);
                choice.token_ids.push(token.id);
                choice.logprobs.push(token);
                choice.versions.push(version);
                let tokenizer = &self.app.tokenizer;
                let id = *choice.token_ids.last().unwrap_or(&0);
                if tokenizer.id_to_token(id).is_some()
                    && let Ok(Some(piece)) = choice.decoder.step(tokenizer, id)
                {
                    choice.decoded.push_str(&piece);
                }
                let text = if self.spec.stream {
                    self.releasable_text(index)?
                } else {
                    String::new()
                };
                Ok(Some(Update::Token {
                    choice: index,
                    token: self.choices[index].logprobs.len() - 1,
                    text,
                    finished: false,
                }))
            }
            BatchEvent::Finished { sample, reason } => {
                let index = prompt * self.spec.params.n + sample;
                self.choices[index].finish = Some(reason);
                self.finished += 1;
                if self.is_done() {
                    self.app
                        .metrics
                        .e2e_latency
                        .observe(self.arrived.elapsed().as_secs_f64());
                }
                // The text the last token released (a stream sends it with the finish reason).
                let text = if self.spec.stream {
                    self.releasable_text(index)?
                } else {
                    String::new()
                };
                Ok(Some(Update::Token {
                    choice: index,
                    token: self.choices[index].logprobs.len().saturating_sub(1),
                    text,
                    finished: true,
                }))
            }
            BatchEvent::Failed(message) => {
                Err(ApiError::internal(format!("generation failed: {message}")))
            }
        }
    }

    /// For streams: the text choice `index` may send now, marked as sent.
    pub fn releasable_text(&mut self, index: usize) -> Result<String, ApiError> {
        let finished = self.choices[index].finish.is_some();
        let end = if finished {
            // Everything up to the final text's end.
            let text = self.final_text(index)?;
            let choice = &mut self.choices[index];
            let cut = self
                .tool_parser
                .and_then(|parser| parser.parse(&text, "").calls_at)
                .unwrap_or(text.len());
            let released = text[..cut]
                .get(choice.sent..)
                .unwrap_or_default()
                .to_string();
            choice.sent = choice.sent.max(cut);
            return Ok(released);
        } else {
            let choice = &self.choices[index];
            let text = &choice.decoded;
            let mut end = text.len();
            if self.holdback_chars > 0 {
                end = text
                    .char_indices()
                    .rev()
                    .nth(self.holdback_chars - 1)
                    .map_or(0, |(at, _)| at);
            }
            if let Some(at) = self.tool_parser.and_then(|parser| parser.call_start(text)) {
                end = end.min(at);
            }
            end
        };
        let choice = &mut self.choices[index];
        if end <= choice.sent {
            return Ok(String::new());
        }
        let released = choice.decoded[choice.sent..end].to_string();
        choice.sent = end;
        Ok(released)
    }

    /// The final text of a finished choice (see the module doc); "" for a request that asked for
    /// no tokens.
    pub fn final_text(&self, index: usize) -> Result<String, ApiError> {
        let choice = &self.choices[index];
        if self.spec.generate_nothing {
            return Ok(String::new());
        }
        let reason = choice.finish.clone().unwrap_or(FinishReason::Length);
        let detokenizer = TextOf {
            tokenizer: &self.app.tokenizer,
            skip_special_tokens: self.spec.skip_special_tokens,
        };
        self.stop
            .final_text(&choice.token_ids, &reason, &detokenizer)
            .map_err(|e| ApiError::internal(e.to_string()))
    }

    /// The generated tokens of a choice as the response reports them (none for `max_tokens: 0`).
    pub fn reported_tokens(&self, index: usize) -> usize {
        if self.spec.generate_nothing {
            0
        } else {
            self.choices[index].token_ids.len()
        }
    }

    /// OpenAI's `finish_reason` and vLLM's `stop_reason` of a finished choice.
    pub fn finish_fields(&self, index: usize) -> (&'static str, serde_json::Value) {
        if self.spec.generate_nothing {
            return ("length", serde_json::Value::Null);
        }
        match &self.choices[index].finish {
            Some(FinishReason::Eos { token_id }) => (
                "stop",
                if self.spec.user_stop_token_ids.contains(token_id) {
                    serde_json::json!(token_id)
                } else {
                    serde_json::Value::Null
                },
            ),
            Some(FinishReason::StopString { stop }) => ("stop", serde_json::json!(stop)),
            Some(FinishReason::Length) | None => ("length", serde_json::Value::Null),
        }
    }

    pub fn usage(&self) -> serde_json::Value {
        let prompt_tokens: usize = self.spec.prompts.iter().map(|p| p.ids.len()).sum();
        let completion_tokens: usize = (0..self.choices.len())
            .map(|i| self.reported_tokens(i))
            .sum();
        serde_json::json!({
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": null,
        })
    }

    /// Runs to the end (non-streaming answers).
    pub async fn finish(&mut self) -> Result<(), ApiError> {
        while self.next().await?.is_some() {}
        Ok(())
    }

    pub fn app(&self) -> &Arc<App> {
        &self.app
    }
}

/// A token as text: its own decoding, or `token_id:<id>` when asked.
pub fn token_string(tokenizer: &Tokenizer, id: u32, as_ids: bool) -> String {
    if as_ids {
        return format!("token_id:{id}");
    }
    tokenizer.decode(&[id], false).unwrap_or_default()
}
