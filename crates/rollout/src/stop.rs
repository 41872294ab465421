//! When a generated sequence ends, and what its text is: stop token ids, stop strings that may
//! span token boundaries, and the token limit.
//!
//! What it is: the [`Detokenizer`] seam through which the engine (which only knows ids) reaches
//! text, and [`StopCriteria`], checked after every sampled token. What it is not: tokenization
//! of prompts, or any knowledge of a particular tokenizer.
//!
//! Invariants:
//! - Checks run in a fixed order after each token: stop token id, then stop strings, then length,
//!   so a stop token that is also the last allowed token reports `Eos`.
//! - Stop strings are searched in the decoding of ALL generated ids so far (not token by token),
//!   so a stop string split over several tokens, or completed only when a multi-byte character is,
//!   is found. The earliest match wins; among matches at the same offset the one listed first.
//! - The text of a finished sample ends just before the matched stop string and never contains a
//!   stop token's own text (the stop token is left out of the decoded ids).
//!
//! Cost: with stop strings, every step decodes the whole continuation, O(length^2) per sample;
//! fine for the lengths RL uses, and robust to detokenizers that are not prefix-stable.

use crate::error::RolloutError;
use crate::request::FinishReason;

/// Turns generated token ids into text. Implemented for `stoke_tokenizer::hf::Tokenizer` (special
/// tokens skipped) and for any `Fn(&[u32]) -> Result<String, String>`.
pub trait Detokenizer {
    fn decode(&self, ids: &[u32]) -> Result<String, String>;
}

impl<F> Detokenizer for F
where
    F: Fn(&[u32]) -> Result<String, String>,
{
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self(ids)
    }
}

/// Decodes with special tokens skipped (a stop token's text never reaches the output).
///
/// Ids the tokenizer does not know decode to no text, as Hugging Face's decoders do: model
/// vocabularies are often padded past the tokenizer's (Qwen2.5: 151,936 rows for 151,665
/// tokens), and an untrained or lightly trained model can sample such a row. The ids stay in the
/// completion's `token_ids`; only the text omits them.
impl Detokenizer for stoke_tokenizer::hf::Tokenizer {
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        let known: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| self.id_to_token(id).is_some())
            .collect();
        stoke_tokenizer::hf::Tokenizer::decode(self, &known, true)
            .map_err(|error| error.to_string())
    }
}

/// The stop conditions of one request.
#[derive(Debug, Clone)]
pub struct StopCriteria {
    stop_token_ids: Vec<u32>,
    stop_strings: Vec<String>,
    max_new_tokens: usize,
}

impl StopCriteria {
    /// Stop strings need a detokenizer to be checked; asking for them without one is an error
    /// rather than a silent no-op.
    pub fn new(
        stop_token_ids: Vec<u32>,
        stop_strings: Vec<String>,
        max_new_tokens: usize,
        has_detokenizer: bool,
    ) -> Result<Self, RolloutError> {
        if !stop_strings.is_empty() && !has_detokenizer {
            return Err(RolloutError::InvalidParam {
                field: "stop_strings",
                reason: "stop strings need a detokenizer, and none was given".into(),
            });
        }
        Ok(StopCriteria {
            stop_token_ids,
            stop_strings,
            max_new_tokens,
        })
    }

    /// Whether the sequence `generated` (all ids sampled so far, the newest last) is finished.
    pub fn check(
        &self,
        generated: &[u32],
        detokenizer: Option<&dyn Detokenizer>,
    ) -> Result<Option<FinishReason>, RolloutError> {
        let Some(&last) = generated.last() else {
            return Ok(None);
        };
        if self.stop_token_ids.contains(&last) {
            return Ok(Some(FinishReason::Eos { token_id: last }));
        }
        if let (false, Some(detokenizer)) = (self.stop_strings.is_empty(), detokenizer) {
            let text = decode(detokenizer, generated)?;
            if let Some((_, stop)) = self.earliest_stop_string(&text) {
                return Ok(Some(FinishReason::StopString {
                    stop: stop.to_string(),
                }));
            }
        }
        if generated.len() >= self.max_new_tokens {
            return Ok(Some(FinishReason::Length));
        }
        Ok(None)
    }

    /// The text of a finished (or cut-off) sample: the decoding of its ids without a final stop
    /// token, cut just before the earliest stop string.
    pub fn final_text(
        &self,
        generated: &[u32],
        reason: &FinishReason,
        detokenizer: &dyn Detokenizer,
    ) -> Result<String, RolloutError> {
        let ids = match reason {
            FinishReason::Eos { .. } => &generated[..generated.len().saturating_sub(1)],
            _ => generated,
        };
        let mut text = decode(detokenizer, ids)?;
        if let FinishReason::StopString { .. } = reason
            && let Some((offset, _)) = self.earliest_stop_string(&text)
        {
            text.truncate(offset);
        }
        Ok(text)
    }

    fn earliest_stop_string<'s>(&'s self, text: &str) -> Option<(usize, &'s str)> {
        let mut earliest: Option<(usize, &str)> = None;
        for stop in &self.stop_strings {
            if let Some(offset) = text.find(stop.as_str())
                && earliest.is_none_or(|(best, _)| offset < best)
            {
                earliest = Some((offset, stop));
            }
        }
        earliest
    }
}

fn decode(detokenizer: &dyn Detokenizer, ids: &[u32]) -> Result<String, RolloutError> {
    detokenizer.decode(ids).map_err(RolloutError::Detokenize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary whose tokens are short strings, so stop strings can straddle them.
    const VOCAB: [&str; 6] = ["Hel", "lo", " wor", "ld", "\n", "<eos>"];

    fn toy_decode(ids: &[u32]) -> Result<String, String> {
        ids.iter()
            .map(|&id| {
                VOCAB
                    .get(id as usize)
                    .copied()
                    .ok_or(format!("unknown id {id}"))
            })
            .collect()
    }

    fn criteria(stops: &[&str], max: usize) -> StopCriteria {
        StopCriteria::new(
            vec![5],
            stops.iter().map(|s| s.to_string()).collect(),
            max,
            true,
        )
        .unwrap()
    }

    #[test]
    fn stop_string_spanning_tokens_is_found_when_completed_and_trimmed() {
        let stop = criteria(&["lo wo"], 100);
        let decoder: &dyn Detokenizer = &toy_decode;
        assert_eq!(stop.check(&[0], Some(decoder)).unwrap(), None);
        assert_eq!(stop.check(&[0, 1], Some(decoder)).unwrap(), None);
        let reason = stop.check(&[0, 1, 2], Some(decoder)).unwrap().unwrap();
        assert_eq!(
            reason,
            FinishReason::StopString {
                stop: "lo wo".into()
            }
        );
        assert_eq!(
            stop.final_text(&[0, 1, 2], &reason, decoder).unwrap(),
            "Hel"
        );
    }

    #[test]
    fn earliest_stop_string_wins() {
        let stop = criteria(&["world", "lo"], 100);
        let decoder: &dyn Detokenizer = &toy_decode;
        // "Hello world": both appear once the text is complete; "lo" starts first.
        let ids = [0, 1, 2, 3];
        let reason = FinishReason::StopString { stop: "lo".into() };
        assert_eq!(
            stop.check(&ids[..2], Some(decoder)).unwrap(),
            Some(reason.clone())
        );
        assert_eq!(stop.final_text(&ids, &reason, decoder).unwrap(), "Hel");
    }

    #[test]
    fn stop_token_ends_the_sample_and_is_left_out_of_the_text() {
        let stop = criteria(&[], 3);
        let decoder: &dyn Detokenizer = &toy_decode;
        // The stop token arrives as the 3rd (last allowed) token: Eos takes precedence.
        let reason = stop.check(&[0, 1, 5], Some(decoder)).unwrap().unwrap();
        assert_eq!(reason, FinishReason::Eos { token_id: 5 });
        assert_eq!(
            stop.final_text(&[0, 1, 5], &reason, decoder).unwrap(),
            "Hello"
        );
    }

    #[test]
    fn length_limit_ends_the_sample() {
        let stop = criteria(&["\n"], 2);
        let decoder: &dyn Detokenizer = &toy_decode;
        assert_eq!(stop.check(&[0], Some(decoder)).unwrap(), None);
        assert_eq!(
            stop.check(&[0, 1], Some(decoder)).unwrap(),
            Some(FinishReason::Length)
        );
    }

    #[test]
    fn stop_strings_without_a_detokenizer_are_rejected() {
        let error = StopCriteria::new(vec![], vec!["x".into()], 4, false).unwrap_err();
        assert!(error.to_string().contains("stop_strings"), "{error}");
    }

    #[test]
    fn detokenizer_failure_is_an_error_not_a_panic() {
        let stop = criteria(&["x"], 4);
        let decoder: &dyn Detokenizer = &toy_decode;
        let error = stop.check(&[0, 99], Some(decoder)).unwrap_err();
        assert!(error.to_string().contains("unknown id 99"), "{error}");
    }
}
