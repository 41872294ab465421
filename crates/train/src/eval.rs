//! Held-out evaluation during training: mean next-token loss and bits-per-byte over a fixed set
//! of evaluation micro-batches.
//!
//! The evaluation set is drawn once from the eval source when the run starts and reused at
//! every evaluation, so successive figures compare the same tokens (and a resumed run evaluates
//! exactly what the uninterrupted one did). Nothing here changes the model or the training data.
//!
//! Bits-per-byte (nanochat/Pile convention): total nats of the scored targets / ln 2 / total
//! UTF-8 bytes those targets decode to, so models with different tokenizers compare. Each token
//! id's byte count is computed once from the tokenizer; tokens that decode to no text (special
//! tokens such as `<|endoftext|>`) count 0 bytes and are left out of both sums, since they carry
//! no text to compress.
//!
//! What this is not: no generation-based metrics (the eval crate does those).

use stoke_data::packing::PackedBatch;
use stoke_model::Transformer;
use stoke_tokenizer::hf::Tokenizer;

use crate::error::TrainError;
use crate::objective::score_loss_tokens;

/// Result of one evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalResult {
    /// Mean nats per scored token.
    pub loss: f64,
    /// `None` without a tokenizer (no byte counts) or when no scored token has bytes.
    pub bits_per_byte: Option<f64>,
    /// Scored tokens.
    pub tokens: u64,
}

/// A fixed evaluation set and the byte count of every token id.
#[derive(Clone, Debug)]
pub struct Evaluator {
    batches: Vec<PackedBatch>,
    bytes_per_token: Option<Vec<u32>>,
    logit_softcap: Option<f64>,
}

impl Evaluator {
    pub fn new(
        batches: Vec<PackedBatch>,
        bytes_per_token: Option<Vec<u32>>,
        logit_softcap: Option<f64>,
    ) -> Evaluator {
        Evaluator {
            batches,
            bytes_per_token,
            logit_softcap,
        }
    }

    pub fn num_batches(&self) -> usize {
        self.batches.len()
    }

    /// Scores every evaluation batch (no gradients are taken).
    pub fn evaluate(&self, model: &Transformer) -> Result<EvalResult, TrainError> {
        let mut nats = 0.0f64;
        let mut tokens = 0u64;
        let mut byte_nats = 0.0f64;
        let mut bytes = 0u64;
        for batch in &self.batches {
            let Some(scored) = score_loss_tokens(model, batch, self.logit_softcap, false)? else {
                continue;
            };
            let logprobs: Vec<f32> = scored.logprobs.detach().to_vec1()?;
            for (&logprob, &target) in logprobs.iter().zip(&scored.target_ids) {
                let nll = -(logprob as f64);
                nats += nll;
                tokens += 1;
                if let Some(table) = &self.bytes_per_token {
                    let n = table.get(target as usize).copied().unwrap_or(0);
                    if n > 0 {
                        byte_nats += nll;
                        bytes += n as u64;
                    }
                }
            }
        }
        Ok(EvalResult {
            loss: if tokens > 0 {
                nats / tokens as f64
            } else {
                f64::NAN
            },
            bits_per_byte: (bytes > 0).then(|| byte_nats / std::f64::consts::LN_2 / bytes as f64),
            tokens,
        })
    }
}

/// UTF-8 byte length of every token id's text (0 for special tokens and ids without text).
///
/// A byte-level BPE token that holds part of a multi-byte character decodes alone to U+FFFD;
/// such tokens are counted through the GPT-2 byte-to-character table (each character of the
/// token string stands for one byte), which makes the counts sum to the text's byte length.
pub fn bytes_per_token(tokenizer: &Tokenizer, vocab_size: usize) -> Vec<u32> {
    let byte_chars = gpt2_byte_chars();
    (0..vocab_size as u32)
        .map(|id| {
            let Ok(text) = tokenizer.decode(&[id], true) else {
                return 0;
            };
            if text.is_empty() {
                return 0;
            }
            if text.contains('\u{FFFD}')
                && let Some(token) = tokenizer.id_to_token(id)
                && token.chars().all(|c| byte_chars.contains(&c))
            {
                return token.chars().count() as u32;
            }
            text.len() as u32
        })
        .collect()
}

/// The 256 characters GPT-2's byte-level encoding maps bytes to.
fn gpt2_byte_chars() -> Vec<char> {
    let mut chars = Vec::with_capacity(256);
    let mut extra = 0u32;
    for b in 0u32..256 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        if printable {
            chars.push(char::from_u32(b).unwrap_or('\0'));
        } else {
            chars.push(char::from_u32(256 + extra).unwrap_or('\0'));
            extra += 1;
        }
    }
    chars
}
