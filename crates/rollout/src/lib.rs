//! stoke-rollout: the generation engine. Turns prompts (token ids) into sampled completions with
//! per-token log-probabilities, using batched prefill and KV-cached decoding.
//!
//! The engine knows nothing of text: prompts arrive tokenized, and text comes back only through a
//! caller-supplied [`Detokenizer`]. Modules: [`sampling`] (one logits row -> one token),
//! [`stop`] (when a sample ends), [`request`] (typed request/response), [`engine`] (batching and
//! the KV cache of one request), [`batcher`] (continuous batching of many requests), [`live`] (generation whose weights may change between decode steps), [`speculative`]
//! (self-speculative decoding with a model's multi-token prediction module).

pub mod batcher;
pub mod engine;
pub mod error;
pub mod live;
pub mod request;
pub mod sampling;
pub mod score;
pub mod speculative;
pub mod stop;

pub use batcher::{
    BatchEvent, BatchLimits, BatchLoad, BatchRequest, Batcher, EventSink, LogprobRequest,
    RequestId, StepReport, TokenLogprob,
};
pub use engine::{Engine, generate_live};
pub use error::RolloutError;
pub use live::{FixedWeights, LiveGeneration, LiveWeights};
pub use request::{
    Completion, FinishReason, GenerationOutput, GenerationRequest, SamplingParams, StreamKey,
};
pub use sampling::{LogprobMode, SampleStream, SampledToken, SamplingRule};
pub use speculative::{SpeculativeOutput, SpeculativeStats, generate_speculative};
pub use stop::{Detokenizer, StopCriteria};
