//! Self-speculative decoding with the model's own multi-token prediction module (DeepSeek-V3's
//! MTP): the module drafts the token after next, and the main model verifies it in the same
//! forward pass that produces the next distribution, so an accepted draft yields two tokens per
//! main-model step.
//!
//! What it is: [`generate_speculative`], the engine's loop for a model with MTP modules (fixed
//! weights). Every emitted token has exactly the distribution non-speculative sampling gives it
//! (speculative sampling, Leviathan et al. 2023 / Chen et al. 2023): with `p` the main model's
//! processed distribution (temperature, top-k, top-p, as `sampling` applies them) and `q` the
//! module's under the same rule, a draft `d ~ q` is accepted with probability
//! `min(1, p(d) / q(d))`; on rejection the token is drawn from `max(0, p - q)` renormalized. An
//! accepted draft is followed by a token drawn from the main model's next distribution. Under
//! greedy decoding the draft is accepted exactly when it is the main model's argmax, so the output
//! is the greedy sequence. The log-probability reported for every token is the main model's
//! (`log p(token)`, processed; raw for greedy, as `sampling` reports it), never the module's.
//!
//! What it is not: a change of the random stream's use. A sample's stream is keyed as in the
//! plain engine, but speculative decoding consumes it differently (draft, acceptance and residual
//! draws), so for a given seed the sampled tokens differ from the plain engine's while their
//! distribution is the same.
//!
//! How the caches work: the main model's cache gets both fed slots (the pending token and the
//! draft) each step; a rejected draft's slot stays in the cache but is masked out of every later
//! query (`key_valid`), and positions count valid tokens only, so the rows of a batch can accept
//! different numbers of tokens and stay rectangular. The module keeps its own cache the same way:
//! entry i joins the main model's final-normed hidden state at position i with the embedding of
//! token i + 1, at that token's position (transformers' MtpModel convention, which training uses).
//!
//! Invariants: a sample finishes with `Length` one position early when a step would feed its
//! draft past `max_position_embeddings` (a draft needs its own slot).

use candle_core::{DType, Device, IndexOp, Tensor};
use stoke_model::{KvCache, Transformer, causal_bias};

use crate::error::RolloutError;
use crate::request::{
    Completion, FinishReason, GenerationOutput, GenerationRequest, check_prompts,
};
use crate::sampling::{SampleStream, SamplingRule, greedy, truncated_distribution};
use crate::stop::{Detokenizer, StopCriteria};

/// Id written into padded prompt slots (masked keys, ignored queries).
const PAD_ID: u32 = 0;

/// How speculative decoding went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculativeStats {
    /// Main-model forward passes after the prefill (one per decode step of the batch).
    pub main_steps: usize,
    /// Drafts the main model verified, and how many it accepted.
    pub drafted: usize,
    pub accepted: usize,
}

impl SpeculativeStats {
    /// The share of verified drafts that were accepted.
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// The engine's output and the speculation's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeOutput {
    pub output: GenerationOutput,
    pub stats: SpeculativeStats,
}

/// One token distribution of a row, under the request's rule.
enum Distribution {
    /// Greedy: the argmax (lowest id on ties) and its raw log-probability.
    Greedy { id: u32, logprob: f32 },
    /// Sampled: each token's probability after temperature, top-k and top-p (0 outside).
    Sampled(Vec<f64>),
}

impl Distribution {
    fn of(logits: &[f32], rule: &SamplingRule) -> Result<Distribution, RolloutError> {
        if let Some(bad) = logits.iter().position(|x| x.is_nan()) {
            return Err(RolloutError::BadLogits(format!(
                "NaN at vocabulary id {bad}"
            )));
        }
        if rule.is_greedy() {
            let token = greedy(logits);
            return Ok(Distribution::Greedy {
                id: token.id,
                logprob: token.logprob,
            });
        }
        let mut probs = vec![0.0f64; logits.len()];
        for candidate in truncated_distribution(logits, rule) {
            probs[candidate.id as usize] = candidate.logprob.exp();
        }
        Ok(Distribution::Sampled(probs))
    }

    /// A token drawn from the distribution (greedy: its argmax, no draw).
    fn draw(&self, stream: &mut SampleStream) -> u32 {
        match self {
            Distribution::Greedy { id, .. } => *id,
            Distribution::Sampled(probs) => draw_from(probs, stream.next_uniform()),
        }
    }

    /// The log-probability reported for `id` (processed; greedy: raw, of the argmax).
    fn logprob(&self, id: u32) -> f32 {
        match self {
            Distribution::Greedy { logprob, .. } => *logprob,
            Distribution::Sampled(probs) => probs[id as usize].ln() as f32,
        }
    }
}

/// Inverse-CDF draw over `weights` (not necessarily normalized) in id order; the last token
/// with weight when rounding leaves the sum just below `u`.
fn draw_from(weights: &[f64], u: f64) -> u32 {
    let total: f64 = weights.iter().sum();
    let target = u * total;
    let mut cumulative = 0.0;
    let mut last = 0;
    for (id, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            cumulative += w;
            last = id;
            if target < cumulative {
                return id as u32;
            }
        }
    }
    last as u32
}

/// The verification of a draft `d ~ q` against the main model's `p` at the draft's slot: the
/// emitted token, its log-probability under `p`, and whether it is the draft.
fn verify(
    p: &Distribution,
    q: &Distribution,
    draft: u32,
    stream: &mut SampleStream,
) -> (u32, f32, bool) {
    match (p, q) {
        (Distribution::Greedy { id, logprob }, _) => (*id, *logprob, *id == draft),
        (Distribution::Sampled(p_probs), Distribution::Sampled(q_probs)) => {
            let (pd, qd) = (p_probs[draft as usize], q_probs[draft as usize]);
            // qd > 0: the draft was drawn from q.
            if stream.next_uniform() < (pd / qd).min(1.0) {
                return (draft, p.logprob(draft), true);
            }
            let residual: Vec<f64> = p_probs
                .iter()
                .zip(q_probs)
                .map(|(&a, &b)| (a - b).max(0.0))
                .collect();
            // Rejection has probability sum(residual) > 0; rounding can leave it at 0 when p
            // and q agree to the last bit, and then p itself is the residual's limit.
            let weights = if residual.iter().sum::<f64>() > 0.0 {
                &residual
            } else {
                p_probs
            };
            let id = draw_from(weights, stream.next_uniform());
            (id, p.logprob(id), false)
        }
        (Distribution::Sampled(_), Distribution::Greedy { .. }) => {
            unreachable!("p and q come from the same rule")
        }
    }
}

/// One sample being generated.
struct Row {
    prompt_index: usize,
    sample_index: usize,
    stream: SampleStream,
    /// Position of the pending token (the newest emitted one, not yet fed).
    position: usize,
    /// The module's draft for the slot after the pending token, and its distribution.
    draft: u32,
    draft_distribution: Distribution,
    token_ids: Vec<u32>,
    logprobs: Vec<f32>,
    finish_reason: Option<FinishReason>,
}

impl Row {
    /// Emits `id`; returns whether the sample finished.
    fn emit(
        &mut self,
        id: u32,
        logprob: f32,
        stop: &StopCriteria,
        detokenizer: Option<&dyn Detokenizer>,
    ) -> Result<bool, RolloutError> {
        self.token_ids.push(id);
        self.logprobs.push(logprob);
        self.finish_reason = stop.check(&self.token_ids, detokenizer)?;
        Ok(self.finish_reason.is_some())
    }
}

/// Speculative generation with MTP module 0 as the drafter (see the module doc).
pub fn generate_speculative(
    model: &Transformer,
    request: &GenerationRequest,
    detokenizer: Option<&dyn Detokenizer>,
) -> Result<SpeculativeOutput, RolloutError> {
    if model.num_mtp_modules() == 0 {
        return Err(RolloutError::InvalidParam {
            field: "speculative",
            reason: format!(
                "the model ({}) has no multi-token prediction module to draft with",
                model.config().architecture.model_type()
            ),
        });
    }
    let params = &request.params;
    let rule = params.validate()?;
    let stop = StopCriteria::new(
        params.stop_token_ids.clone(),
        params.stop_strings.clone(),
        params.max_new_tokens,
        detokenizer.is_some(),
    )?;
    check_prompts(model, &request.prompts)?;
    request.check_streams()?;
    let device = model.device().clone();
    let config = model.config();
    let width = config.hidden_size;
    let max_positions = config.max_position_embeddings;
    let mut stats = SpeculativeStats::default();

    // 1. Prefill the prompts (left-padded), keeping every position's hidden state.
    let prompts = &request.prompts;
    let slots = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::new();
    let mut positions = Vec::new();
    let mut prompt_valid = Vec::new();
    for prompt in prompts {
        let padding = slots - prompt.len();
        ids.extend(std::iter::repeat_n(PAD_ID, padding).chain(prompt.iter().copied()));
        positions.extend((0..slots).map(|s| s.saturating_sub(padding) as u32));
        prompt_valid.push((0..slots).map(|s| s >= padding).collect::<Vec<bool>>());
    }
    let batch = prompts.len();
    let ids_tensor = Tensor::from_vec(ids.clone(), (batch, slots), &device)?;
    let positions_tensor = Tensor::from_vec(positions.clone(), (batch, slots), &device)?;
    let bias = causal_bias(&prompt_valid, slots, &device)?;
    let mut cache = KvCache::new(config.num_hidden_layers);
    let hidden = model.forward_hidden(&ids_tensor, &positions_tensor, &bias, Some(&mut cache))?;
    let last_logits = logits_rows(model, &hidden.i((.., slots - 1, ..))?.contiguous()?)?;

    // 2. Fan out n samples per prompt; each draws its first token from the main model.
    let n = params.n;
    let fan_out: Vec<usize> = (0..batch).flat_map(|i| std::iter::repeat_n(i, n)).collect();
    let mut cache = cache.select_batch(&fan_out)?;
    let mut key_valid: Vec<Vec<bool>> = fan_out.iter().map(|&i| prompt_valid[i].clone()).collect();
    let index = Tensor::from_vec(
        fan_out.iter().map(|&i| i as u32).collect::<Vec<u32>>(),
        fan_out.len(),
        &device,
    )?;
    let hidden = hidden.index_select(&index, 0)?;
    let mut rows: Vec<Row> = Vec::with_capacity(fan_out.len());
    for (r, &prompt_index) in fan_out.iter().enumerate() {
        let mut stream = request.stream(prompt_index, r % n);
        let p = Distribution::of(&last_logits[prompt_index], &rule)?;
        let first = p.draw(&mut stream);
        let mut row = Row {
            prompt_index,
            sample_index: r % n,
            stream,
            position: prompts[prompt_index].len(),
            draft: 0,
            draft_distribution: Distribution::Greedy {
                id: 0,
                logprob: 0.0,
            },
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: None,
        };
        row.emit(first, p.logprob(first), &stop, detokenizer)?;
        rows.push(row);
    }

    // 3. The module's prefill: entry s joins the hidden state at slot s with the token at
    // slot s + 1 (the sampled first token after the last slot), at that token's position.
    let mut mtp_cache = KvCache::new(model.num_mtp_modules());
    let mut next = Vec::with_capacity(rows.len() * slots);
    let mut next_positions = Vec::with_capacity(rows.len() * slots);
    for row in &rows {
        let base = row.prompt_index * slots;
        for s in 0..slots {
            next.push(if s + 1 < slots {
                ids[base + s + 1]
            } else {
                row.token_ids[0]
            });
            next_positions.push(positions[base + s] + 1);
        }
    }
    let mut mtp_valid = key_valid.clone();
    let out = model.mtp_hidden(
        0,
        &hidden,
        &Tensor::from_vec(next, (rows.len(), slots), &device)?,
        &Tensor::from_vec(next_positions, (rows.len(), slots), &device)?,
        &causal_bias(&mtp_valid, slots, &device)?,
        Some(&mut mtp_cache),
    )?;
    let draft_logits = logits_rows(model, &out.i((.., slots - 1, ..))?.contiguous()?)?;
    for (row, logits) in rows.iter_mut().zip(&draft_logits) {
        row.draft_distribution = Distribution::of(logits, &rule)?;
        row.draft = row.draft_distribution.draw(&mut row.stream);
    }

    // 4. Decode: feed [pending, draft], verify the draft, draft again from the module. Every
    // product here is on few rows without a gradient (`stoke_ops::linear::Decoding`).
    let _decoding = stoke_ops::linear::Decoding::begin();
    let mut finished: Vec<Row> = Vec::new();
    loop {
        // Rows that finished, or whose draft would not fit, leave the batch.
        for row in &mut rows {
            if row.finish_reason.is_none() && row.position + 1 >= max_positions {
                row.finish_reason = Some(FinishReason::Length);
            }
        }
        let keep: Vec<usize> = (0..rows.len())
            .filter(|&r| rows[r].finish_reason.is_none())
            .collect();
        if keep.len() < rows.len() {
            let mut kept = Vec::with_capacity(keep.len());
            for (r, row) in rows.drain(..).enumerate() {
                if keep.contains(&r) {
                    kept.push(row);
                } else {
                    finished.push(row);
                }
            }
            rows = kept;
            if rows.is_empty() {
                break;
            }
            cache = cache.select_batch(&keep)?;
            mtp_cache = mtp_cache.select_batch(&keep)?;
            key_valid = keep.iter().map(|&r| key_valid[r].clone()).collect();
            mtp_valid = keep.iter().map(|&r| mtp_valid[r].clone()).collect();
        }
        let live = rows.len();
        let mut input = Vec::with_capacity(live * 2);
        let mut input_positions = Vec::with_capacity(live * 2);
        for row in &rows {
            let pending = *row.token_ids.last().unwrap_or(&PAD_ID);
            input.extend([pending, row.draft]);
            input_positions.extend([row.position as u32, row.position as u32 + 1]);
        }
        for valid in key_valid.iter_mut() {
            valid.extend([true, true]);
        }
        let hidden = model.forward_hidden(
            &Tensor::from_vec(input.clone(), (live, 2), &device)?,
            &Tensor::from_vec(input_positions, (live, 2), &device)?,
            &causal_bias(&key_valid, 2, &device)?,
            Some(&mut cache),
        )?;
        stats.main_steps += 1;
        let logits = logits_rows(model, &hidden.reshape((live * 2, width))?)?;
        // Per row: (accepted, the token after the pending one, the token after that if any).
        let mut mtp_prev_slot = Vec::with_capacity(live * 2);
        let mut mtp_next = Vec::with_capacity(live * 2);
        let mut mtp_positions = Vec::with_capacity(live * 2);
        let mut read_entry = Vec::with_capacity(live);
        for (r, row) in rows.iter_mut().enumerate() {
            let p_draft_slot = Distribution::of(&logits[2 * r], &rule)?;
            let (token, logprob, accepted) = verify(
                &p_draft_slot,
                &row.draft_distribution,
                row.draft,
                &mut row.stream,
            );
            stats.drafted += 1;
            let position = row.position;
            if accepted {
                stats.accepted += 1;
                let mut bonus = None;
                if !row.emit(token, logprob, &stop, detokenizer)? {
                    let p_next = Distribution::of(&logits[2 * r + 1], &rule)?;
                    let id = p_next.draw(&mut row.stream);
                    row.emit(id, p_next.logprob(id), &stop, detokenizer)?;
                    bonus = Some(id);
                }
                row.position = position + 2;
                // Entries (h at the pending slot, draft) and (h at the draft slot, bonus).
                mtp_prev_slot.extend([2 * r, 2 * r + 1]);
                mtp_next.extend([token, bonus.unwrap_or(token)]);
                mtp_positions.extend([position as u32 + 1, position as u32 + 2]);
                mtp_valid[r].extend([true, bonus.is_some()]);
                read_entry.push(1);
            } else {
                // The draft's slot is masked out of every later query.
                if let Some(last) = key_valid[r].last_mut() {
                    *last = false;
                }
                row.emit(token, logprob, &stop, detokenizer)?;
                row.position = position + 1;
                // Entry (h at the pending slot, the resampled token), and a masked filler.
                mtp_prev_slot.extend([2 * r, 2 * r]);
                mtp_next.extend([token, token]);
                mtp_positions.extend([position as u32 + 1, position as u32 + 2]);
                mtp_valid[r].extend([true, false]);
                read_entry.push(0);
            }
        }
        if rows.iter().all(|row| row.finish_reason.is_some()) {
            continue;
        }
        // The module drafts the next slot for every row (finished rows' drafts are unused).
        let prev_index = Tensor::from_vec(
            mtp_prev_slot
                .iter()
                .map(|&s| s as u32)
                .collect::<Vec<u32>>(),
            live * 2,
            &device,
        )?;
        let prev = hidden
            .reshape((live * 2, width))?
            .index_select(&prev_index, 0)?
            .reshape((live, 2, width))?;
        let out = model.mtp_hidden(
            0,
            &prev,
            &Tensor::from_vec(mtp_next, (live, 2), &device)?,
            &Tensor::from_vec(mtp_positions, (live, 2), &device)?,
            &causal_bias(&mtp_valid, 2, &device)?,
            Some(&mut mtp_cache),
        )?;
        let read = Tensor::from_vec(
            read_entry
                .iter()
                .enumerate()
                .map(|(r, &e)| (2 * r + e) as u32)
                .collect::<Vec<u32>>(),
            live,
            &device,
        )?;
        let draft_logits = logits_rows(
            model,
            &out.reshape((live * 2, width))?.index_select(&read, 0)?,
        )?;
        for (row, logits) in rows.iter_mut().zip(&draft_logits) {
            if row.finish_reason.is_some() {
                continue;
            }
            row.draft_distribution = Distribution::of(logits, &rule)?;
            row.draft = row.draft_distribution.draw(&mut row.stream);
        }
    }

    // 5. Per-prompt completions in sample order.
    finished.sort_by_key(|row| (row.prompt_index, row.sample_index));
    let mut completions: Vec<Vec<Completion>> = vec![Vec::with_capacity(n); batch];
    let generated_tokens = finished.iter().map(|row| row.token_ids.len()).sum();
    for row in finished {
        let finish_reason = row.finish_reason.unwrap_or(FinishReason::Length);
        let text = match detokenizer {
            Some(detokenizer) => {
                Some(stop.final_text(&row.token_ids, &finish_reason, detokenizer)?)
            }
            None => None,
        };
        completions[row.prompt_index].push(Completion {
            prompt_index: row.prompt_index,
            sample_index: row.sample_index,
            token_ids: row.token_ids,
            logprobs: row.logprobs,
            text,
            finish_reason,
        });
    }
    Ok(SpeculativeOutput {
        output: GenerationOutput {
            completions,
            prefill_tokens: prompts.iter().map(Vec::len).sum(),
            generated_tokens,
            kv_cache_bytes: cache.bytes() + mtp_cache.bytes(),
        },
        stats,
    })
}

/// The LM head's logits of hidden rows [N, hidden] as host vectors.
fn logits_rows(model: &Transformer, hidden: &Tensor) -> Result<Vec<Vec<f32>>, RolloutError> {
    Ok(model
        .lm_logits(hidden)?
        .to_dtype(DType::F32)?
        .to_device(&Device::Cpu)?
        .to_vec2::<f32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Speculative sampling's one-step law, exactly: over every draft, the probability of
    /// emitting token x is q(x) min(1, p(x)/q(x)) + P(reject) r(x), which must be p(x). Checked
    /// by simulation of `verify` against the closed form on a 4-token vocabulary.
    #[test]
    fn one_verification_step_emits_exactly_p() {
        let p = vec![0.5, 0.3, 0.2, 0.0];
        let q = vec![0.1, 0.2, 0.3, 0.4];
        let p_dist = Distribution::Sampled(p.clone());
        let q_dist = Distribution::Sampled(q.clone());
        let mut stream = SampleStream::new(7, 0, 0);
        let trials = 200_000;
        let mut counts = [0usize; 4];
        for _ in 0..trials {
            let d = q_dist.draw(&mut stream);
            let (token, logprob, _) = verify(&p_dist, &q_dist, d, &mut stream);
            assert!((logprob - (p[token as usize] as f32).ln()).abs() < 1e-6);
            counts[token as usize] += 1;
        }
        for (x, &c) in counts.iter().enumerate() {
            let freq = c as f64 / trials as f64;
            // 5 standard errors of a binomial frequency.
            let tolerance = 5.0 * (p[x] * (1.0 - p[x]) / trials as f64).sqrt() + 1e-9;
            assert!(
                (freq - p[x]).abs() <= tolerance,
                "token {x}: {freq} vs {}",
                p[x]
            );
        }
        assert_eq!(counts[3], 0, "a token p excludes is never emitted");
    }
}
