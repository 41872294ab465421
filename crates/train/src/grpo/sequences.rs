//! Completion log-probabilities of prompt + completion rows under a policy: the one forward pass
//! GRPO needs for the current policy (with a graph), the old policy and the reference (without).
//!
//! Layout: rows are right-padded to the longest `prompt + completion`; every row gets positions
//! `0..len` and a causal bias whose padded keys are masked (`stoke_model::causal_bias`), so a
//! row's log-probs do not depend on the other rows of its batch. The LM head runs only on the
//! positions that predict completion tokens, `prompt_len - 1 ..= prompt_len + completion_len - 2`,
//! through the fused `stoke_ops::linear_target_logprobs`. Temperature `T` scores the
//! distribution `softmax(logits / T)`: the hidden state is scaled by `1 / T` before the head,
//! which is exact because the head is linear, and gradients flow through the scale.
//!
//! Output tensors are `[B, Tc]` with `Tc` the longest completion; slots past a row's completion
//! hold exactly 0 (log-probs and entropy) and no gradient, and the mask marks the real tokens.
//! Zero padding matters downstream: the GRPO ratio `exp(current - old)` of a padded slot is then
//! `exp(0) = 1`, never an overflow that a 0 in the mask would turn into NaN.
//!
//! Shared-prefix packing: GRPO scores `n` completions of the same prompt, and as separate rows
//! the prompt is run `n` times (forward and backward). When consecutive rows share their prompt,
//! [`completion_logprobs`] may instead pack each such group into one sequence
//! `[prompt, c_1, ..., c_n]` with positions `0..P` for the prompt and `P..P + len_i` for each
//! completion, and a bias under which completion `i`'s tokens see the prompt and their own
//! earlier tokens only ([`shared_prefix_bias`]). Every completion token then attends to exactly
//! the keys it would see in its own row, at the same positions, so the log-probs are the same up
//! to float rounding (tested); the first token of every completion is predicted from the one
//! shared last prompt position. On the CPU the packed sequences of a call then go side by side
//! in one row, each starting on a multiple of the attention kernels' query block, instead of
//! one row each padded to the longest (the values are the same bit for bit: see
//! `forward_shared_prefix`). The layout is chosen per call by a FLOP estimate
//! ([`ScoringLayout::choose`]): packing saves the prompt's repeats in every linear layer; on the
//! CPU attention costs only the pairs the mask allows, so packing wins whenever rows share a
//! prompt; where attention is dense (other devices) the packed length makes it quadratic, and
//! packing wins only for short completions of long prompts.
//!
//! [`token_budget_batches`] splits rows into micro-batches by padded size, for callers that
//! score more rows than fit in one forward pass.
//!
//! What this is not: no loss, no sampling, no KV cache (one cache-free forward per call).
//! Invariant: log-probs equal `stoke_rollout::score::next_token_logprobs` on the completion part
//! at temperature 1 (tests/grpo_sequences.rs).

use std::ops::Range;

use candle_core::{D, DType, Device, Tensor};
use stoke_model::{Transformer, causal_bias};

use crate::error::TrainError;

/// One prompt + completion to score. The prompt must hold at least one token (the first
/// completion token is predicted from the prompt's last position).
#[derive(Clone, Copy, Debug)]
pub struct SequenceRow<'a> {
    pub prompt_ids: &'a [u32],
    pub completion_ids: &'a [u32],
}

impl SequenceRow<'_> {
    /// Tokens the row occupies in a forward pass.
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.completion_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Per-token scores of the completions of a batch of rows.
#[derive(Debug)]
pub struct CompletionScores {
    /// `[B, Tc]` f32: `log p(completion token t | prefix)` under `softmax(logits / T)`; carries
    /// the graph. 0 past a row's completion.
    pub logprobs: Tensor,
    /// `[B, Tc]` f32, 1 on real completion tokens, 0 on padding.
    pub mask: Tensor,
    /// `[B, Tc]` f32 detached entropy (nats) of the temperature-scaled distribution at each
    /// completion position, when asked for; 0 past a row's completion.
    pub entropy: Option<Tensor>,
}

impl CompletionScores {
    /// Each row's completion log-probs on the host, padding dropped (what a sample record
    /// stores as its old or reference log-probs).
    pub fn logprob_rows(&self) -> Result<Vec<Vec<f32>>, TrainError> {
        let values = self.logprobs.detach().to_vec2::<f32>()?;
        let mask = self.mask.to_vec2::<f32>()?;
        Ok(values
            .into_iter()
            .zip(mask)
            .map(|(row, keep)| {
                let len = keep.iter().take_while(|&&m| m > 0.0).count();
                row[..len].to_vec()
            })
            .collect())
    }
}

/// Rows of logits materialized at once for the entropy (bounds memory at `CHUNK * vocab`).
const ENTROPY_CHUNK_ROWS: usize = 256;

/// How rows go through the forward pass (the result is the same either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoringLayout {
    /// One padded sequence per row.
    Rows,
    /// One sequence per run of consecutive rows with the same prompt (see the module doc).
    SharedPrefix,
}

impl ScoringLayout {
    /// The layout with the smaller estimated forward cost: linear layers cost `2 * P_lin` FLOPs
    /// per token (`P_lin` the per-layer weights times layers) over padded shapes, attention
    /// `4 * d * L` per (query, key) pair it computes. On the CPU attention computes only the
    /// pairs the mask allows (`stoke_ops::fused_attention`), so packing never costs attention
    /// there; elsewhere it computes the padded square.
    pub fn choose(model: &Transformer, rows: &[SequenceRow<'_>]) -> ScoringLayout {
        ScoringLayout::choose_for(model, rows, model.device().is_cpu())
    }

    /// [`ScoringLayout::choose`] with the attention's cost model given: `masked_only` counts
    /// the allowed pairs, otherwise every padded pair.
    pub fn choose_for(
        model: &Transformer,
        rows: &[SequenceRow<'_>],
        masked_only: bool,
    ) -> ScoringLayout {
        let groups = prompt_groups(rows);
        if groups.len() == rows.len() {
            return ScoringLayout::Rows;
        }
        let c = model.config();
        let (d, layers) = (c.hidden_size as f64, c.num_hidden_layers as f64);
        let attention_width = (c.num_attention_heads * c.head_dim) as f64;
        let linear_per_token =
            2.0 * layers * (4.0 * d * attention_width + 3.0 * d * c.intermediate_size as f64);
        let attention_per_pair = 4.0 * attention_width * layers;
        let triangle = |n: usize| (n * (n + 1) / 2) as f64;
        let cost = |sequences: usize, length: usize, allowed_pairs: f64| {
            let pairs = if masked_only {
                allowed_pairs
            } else {
                (sequences * length * length) as f64
            };
            (sequences * length) as f64 * linear_per_token + pairs * attention_per_pair
        };
        let row_len = rows.iter().map(SequenceRow::len).max().unwrap_or(0);
        // A padding query of a row sees the row's real tokens.
        let row_pairs: f64 = rows
            .iter()
            .map(|r| triangle(r.len()) + ((row_len - r.len()) * r.len()) as f64)
            .sum();
        let rows_cost = cost(rows.len(), row_len, row_pairs);
        let (packed_rows, packed_len, _) = packed_layout(rows, &groups, masked_only);
        let packed_tokens: usize = groups.iter().map(|g| packed_length(&rows[g.clone()])).sum();
        // A completion sees the prompt and its own earlier tokens; padding sees itself.
        let packed_pairs: f64 = groups
            .iter()
            .map(|g| {
                let group = &rows[g.clone()];
                let prompt = group[0].prompt_ids.len();
                let completions: f64 = group
                    .iter()
                    .map(|r| {
                        let len = r.completion_ids.len();
                        (len * prompt) as f64 + triangle(len)
                    })
                    .sum();
                triangle(prompt) + completions
            })
            .sum::<f64>()
            + (packed_rows * packed_len - packed_tokens) as f64;
        if cost(packed_rows, packed_len, packed_pairs) < rows_cost {
            ScoringLayout::SharedPrefix
        } else {
            ScoringLayout::Rows
        }
    }
}

/// One forward over the rows (causal mask, positions from 0, padded keys masked; the layout
/// [`ScoringLayout::choose`] picks); the LM head only on the completion positions. `temperature`
/// must be finite and > 0. Errors name the row and what is wrong with it.
pub fn completion_logprobs(
    model: &Transformer,
    rows: &[SequenceRow<'_>],
    temperature: f32,
    want_entropy: bool,
) -> Result<CompletionScores, TrainError> {
    let layout = if rows.is_empty() {
        ScoringLayout::Rows
    } else {
        ScoringLayout::choose(model, rows)
    };
    completion_logprobs_with(model, rows, temperature, want_entropy, layout)
}

/// [`completion_logprobs`] with the layout given.
pub fn completion_logprobs_with(
    model: &Transformer,
    rows: &[SequenceRow<'_>],
    temperature: f32,
    want_entropy: bool,
    layout: ScoringLayout,
) -> Result<CompletionScores, TrainError> {
    check_rows(model, rows, temperature)?;
    let device = model.device();
    let batch = rows.len();
    let max_completion = rows
        .iter()
        .map(|r| r.completion_ids.len())
        .max()
        .unwrap_or(0);
    let mask = completion_mask(rows, max_completion, device)?;
    if max_completion == 0 {
        let zeros = Tensor::zeros((batch, 0), DType::F32, device)?;
        return Ok(CompletionScores {
            logprobs: zeros.clone(),
            mask,
            entropy: want_entropy.then_some(zeros),
        });
    }

    let (hidden, head_rows, targets) = match layout {
        ScoringLayout::Rows => forward_rows(model, rows)?,
        ScoringLayout::SharedPrefix => forward_shared_prefix(model, rows)?,
    };
    let scored = targets.len();
    let index = Tensor::from_slice(&head_rows, scored, device)?;
    let hidden = hidden.index_select(&index, 0)?.to_dtype(DType::F32)?;
    let targets = Tensor::from_slice(&targets, scored, device)?;
    if model.config().final_logit_softcap.is_some() {
        // The model's logits are soft-capped (Gemma 2): temperature divides the capped logits,
        // as the rollout samples them, so the head cannot fold it into the hidden states.
        let logits = model.lm_logits(&hidden)?.to_dtype(DType::F32)?;
        let logits = if temperature == 1.0 {
            logits
        } else {
            (logits * (1.0 / f64::from(temperature)))?
        };
        let token_logprobs = stoke_ops::token_logprobs(&logits, &targets)?;
        let entropy = if want_entropy {
            Some(entropy_of_logits(&logits.detach())?)
        } else {
            None
        };
        return completion_scores(token_logprobs, entropy, rows, max_completion, scored, mask);
    }
    let hidden = if temperature == 1.0 {
        hidden
    } else {
        (hidden * (1.0 / f64::from(temperature)))?
    };
    let head = model.lm_head_weight().to_dtype(DType::F32)?;
    let token_logprobs = crate::lm_head_logprobs(model, &hidden, &head, &targets)?;

    let entropy = if want_entropy {
        Some(entropy_rows(&hidden.detach(), &head.detach())?)
    } else {
        None
    };
    completion_scores(token_logprobs, entropy, rows, max_completion, scored, mask)
}

/// Per-token log-probs (and entropies) of the scored rows, back to `[B, Tc]`.
fn completion_scores(
    token_logprobs: Tensor,
    entropy: Option<Tensor>,
    rows: &[SequenceRow<'_>],
    max_completion: usize,
    scored: usize,
    mask: Tensor,
) -> Result<CompletionScores, TrainError> {
    let device = token_logprobs.device().clone();
    let device = &device;
    let batch = rows.len();
    // Back to [B, Tc]: slot (b, t) reads entry `scored` (an appended 0) when past the row's
    // completion, so padding is an exact 0 with no gradient path into the model.
    let slots = padded_slots(rows, max_completion, scored);
    let slots = Tensor::from_vec(slots, batch * max_completion, device)?;
    let with_zero = Tensor::cat(
        &[&token_logprobs, &Tensor::zeros(1, DType::F32, device)?],
        0,
    )?;
    let logprobs = with_zero
        .index_select(&slots, 0)?
        .reshape((batch, max_completion))?;

    let entropy = match entropy {
        Some(per_token) => {
            let with_zero = Tensor::cat(&[&per_token, &Tensor::zeros(1, DType::F32, device)?], 0)?;
            Some(
                with_zero
                    .index_select(&slots, 0)?
                    .reshape((batch, max_completion))?,
            )
        }
        None => None,
    };
    Ok(CompletionScores {
        logprobs,
        mask,
        entropy,
    })
}

/// The hidden states `[S * T, d]` of one padded row per input row, the hidden-state rows that
/// predict each completion token (row-major over rows and tokens) and those tokens.
fn forward_rows(
    model: &Transformer,
    rows: &[SequenceRow<'_>],
) -> Result<(Tensor, Vec<u32>, Vec<u32>), TrainError> {
    let device = model.device();
    let batch = rows.len();
    let seq_len = rows.iter().map(SequenceRow::len).max().unwrap_or(0);
    let mut ids = vec![0u32; batch * seq_len];
    let mut key_valid = vec![vec![false; seq_len]; batch];
    for (b, row) in rows.iter().enumerate() {
        let slot = &mut ids[b * seq_len..(b + 1) * seq_len];
        slot[..row.prompt_ids.len()].copy_from_slice(row.prompt_ids);
        slot[row.prompt_ids.len()..row.len()].copy_from_slice(row.completion_ids);
        key_valid[b][..row.len()].fill(true);
    }
    let positions: Vec<u32> = (0..batch).flat_map(|_| 0..seq_len as u32).collect();
    let ids = Tensor::from_vec(ids, (batch, seq_len), device)?;
    let positions = Tensor::from_vec(positions, (batch, seq_len), device)?;
    let bias = causal_bias(&key_valid, seq_len, device)?;
    let hidden = model.forward_hidden(&ids, &positions, &bias, None)?;
    let width = hidden.dim(D::Minus1)?;
    let hidden = hidden.reshape((batch * seq_len, width))?;
    let mut head_rows = Vec::new();
    let mut targets = Vec::new();
    for (b, row) in rows.iter().enumerate() {
        let first = b * seq_len + row.prompt_ids.len() - 1;
        head_rows.extend((0..row.completion_ids.len()).map(|t| (first + t) as u32));
        targets.extend_from_slice(row.completion_ids);
    }
    Ok((hidden, head_rows, targets))
}

/// The same as [`forward_rows`] with each run of rows sharing a prompt packed into one sequence.
///
/// On the CPU the packed sequences go side by side in one row when its dense mask stays small
/// ([`ONE_ROW_MASK_LIMIT`]): no sequence is then padded to the longest, only its start rounded
/// up to a multiple of [`stoke_ops::ATTENTION_ROW_BLOCK`], so that the attention kernels see it
/// in the blocks it would have alone. Every other layer works row by row, so each sequence's
/// values are those of a row of its own, bit for bit (tests/grpo_sequences.rs). Otherwise one
/// padded row per sequence.
fn forward_shared_prefix(
    model: &Transformer,
    rows: &[SequenceRow<'_>],
) -> Result<(Tensor, Vec<u32>, Vec<u32>), TrainError> {
    let groups = prompt_groups(rows);
    let (row_count, row_len, starts) = packed_layout(rows, &groups, model.device().is_cpu());
    pack_groups(model, rows, &groups, row_count, row_len, &starts)
}

/// Where [`forward_shared_prefix`] puts each packed sequence: `(rows, row length, (row,
/// offset) of each group)`.
/// Side by side in one row only where attention computes just the allowed pairs
/// (`masked_only`, the CPU): dense attention over one long row would cost its full square.
fn packed_layout(
    rows: &[SequenceRow<'_>],
    groups: &[Range<usize>],
    masked_only: bool,
) -> (usize, usize, Vec<(usize, usize)>) {
    let align = stoke_ops::ATTENTION_ROW_BLOCK;
    let lengths: Vec<usize> = groups
        .iter()
        .map(|g| packed_length(&rows[g.clone()]))
        .collect();
    let one_row: usize = lengths.iter().map(|l| l.next_multiple_of(align)).sum();
    if masked_only && groups.len() > 1 && one_row * one_row <= ONE_ROW_MASK_LIMIT {
        let mut offset = 0;
        let starts = lengths
            .iter()
            .map(|l| {
                let start = (0, offset);
                offset += l.next_multiple_of(align);
                start
            })
            .collect();
        (1, offset, starts)
    } else {
        let longest = lengths.iter().copied().max().unwrap_or(0);
        (
            groups.len(),
            longest,
            (0..groups.len()).map(|s| (s, 0)).collect(),
        )
    }
}

/// Dense mask entries (row length squared) up to which [`forward_shared_prefix`] puts every
/// packed sequence in one row (16 MiB of f32 bias).
const ONE_ROW_MASK_LIMIT: usize = 1 << 22;

/// The forward pass over `groups` packed at `starts` in `row_count` rows of `row_len` tokens.
fn pack_groups(
    model: &Transformer,
    rows: &[SequenceRow<'_>],
    groups: &[Range<usize>],
    row_count: usize,
    row_len: usize,
    starts: &[(usize, usize)],
) -> Result<(Tensor, Vec<u32>, Vec<u32>), TrainError> {
    let device = model.device();
    let mut ids = vec![0u32; row_count * row_len];
    let mut positions = vec![0u32; row_count * row_len];
    // Segment of each slot: `(group << 16) | part`, part 0 the prompt and i + 1 completion i;
    // PADDING past the packed tokens.
    let mut segments = vec![vec![PADDING_SEGMENT; row_len]; row_count];
    let mut head_rows = Vec::new();
    let mut targets = Vec::new();
    for (s, (group, &(row, offset))) in groups.iter().zip(starts).enumerate() {
        if group.len() >= PART_LIMIT as usize || s >= (u32::MAX >> 16) as usize {
            return Err(TrainError::Other(format!(
                "completion_logprobs: shared-prefix packing takes at most {} completions per \
                 prompt and {} prompts per call; rows {}..{} share a prompt (group {s})",
                PART_LIMIT - 1,
                u32::MAX >> 16,
                group.start,
                group.end
            )));
        }
        let prompt = rows[group.start].prompt_ids;
        let base = row * row_len + offset;
        let segment_row = &mut segments[row][offset..];
        let group_segment = (s as u32) << 16;
        ids[base..base + prompt.len()].copy_from_slice(prompt);
        for (p, position) in positions[base..base + prompt.len()].iter_mut().enumerate() {
            *position = p as u32;
        }
        segment_row[..prompt.len()].fill(group_segment);
        let mut start = prompt.len();
        for (i, row) in rows[group.clone()].iter().enumerate() {
            let len = row.completion_ids.len();
            ids[base + start..base + start + len].copy_from_slice(row.completion_ids);
            for t in 0..len {
                positions[base + start + t] = (prompt.len() + t) as u32;
            }
            segment_row[start..start + len].fill(group_segment | (i as u32 + 1));
            for t in 0..len {
                let predictor = if t == 0 {
                    prompt.len() - 1
                } else {
                    start + t - 1
                };
                head_rows.push((base + predictor) as u32);
            }
            targets.extend_from_slice(row.completion_ids);
            start += len;
        }
    }
    let ids = Tensor::from_vec(ids, (row_count, row_len), device)?;
    let positions = Tensor::from_vec(positions, (row_count, row_len), device)?;
    let bias = shared_prefix_bias(&segments, device)?;
    let hidden = model.forward_hidden(&ids, &positions, &bias, None)?;
    let width = hidden.dim(D::Minus1)?;
    Ok((
        hidden.reshape((row_count * row_len, width))?,
        head_rows,
        targets,
    ))
}

/// Segment id of padding slots in a packed sequence.
const PADDING_SEGMENT: u32 = u32::MAX;
/// Parts (the prompt and its completions) a segment id can tell apart within one prompt.
const PART_LIMIT: u32 = 1 << 16;

/// The additive attention bias `[S, 1, T, T]` of packed sequences. A segment id is
/// `(group << 16) | part`, part 0 a group's prompt: query `q` sees key `k <= q` when `k` is
/// in the prompt of `q`'s group or in `q`'s own segment; a padding query sees only itself (its
/// output is never read, and a row with no finite key would be NaN).
pub fn shared_prefix_bias(segments: &[Vec<u32>], device: &Device) -> Result<Tensor, TrainError> {
    let batch = segments.len();
    let len = segments.first().map_or(0, Vec::len);
    let mut data = vec![f32::NEG_INFINITY; batch * len * len];
    for (s, segment) in segments.iter().enumerate() {
        for q in 0..len {
            let row = &mut data[(s * len + q) * len..(s * len + q + 1) * len];
            if segment[q] == PADDING_SEGMENT {
                row[q] = 0.0;
                continue;
            }
            let prompt = segment[q] & !(PART_LIMIT - 1);
            for k in 0..=q {
                if segment[k] == prompt || segment[k] == segment[q] {
                    row[k] = 0.0;
                }
            }
        }
    }
    Ok(Tensor::from_vec(data, (batch, 1, len, len), device)?)
}

/// Runs of consecutive rows with equal prompts, in order.
fn prompt_groups(rows: &[SequenceRow<'_>]) -> Vec<Range<usize>> {
    let mut groups: Vec<Range<usize>> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        match groups.last_mut() {
            Some(last) if rows[last.start].prompt_ids == row.prompt_ids => last.end = i + 1,
            _ => groups.push(i..i + 1),
        }
    }
    groups
}

/// Tokens of one packed sequence: the prompt once and every completion.
fn packed_length(group: &[SequenceRow<'_>]) -> usize {
    group.first().map_or(0, |r| r.prompt_ids.len())
        + group.iter().map(|r| r.completion_ids.len()).sum::<usize>()
}

/// Splits rows (in order) into consecutive micro-batches whose padded size
/// `rows * max(length)` stays within `budget` (a longer single row is its own batch).
pub fn token_budget_batches(lengths: &[usize], budget: usize) -> Vec<Range<usize>> {
    let mut batches = Vec::new();
    let mut start = 0;
    let mut longest = 0;
    for (i, &length) in lengths.iter().enumerate() {
        let widest = longest.max(length);
        if i > start && (i - start + 1).saturating_mul(widest) > budget {
            batches.push(start..i);
            start = i;
            longest = length;
        } else {
            longest = widest;
        }
    }
    if start < lengths.len() {
        batches.push(start..lengths.len());
    }
    batches
}

fn check_rows(
    model: &Transformer,
    rows: &[SequenceRow<'_>],
    temperature: f32,
) -> Result<(), TrainError> {
    let invalid = |reason: String| TrainError::Other(format!("completion_logprobs: {reason}"));
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(invalid(format!(
            "temperature must be finite and > 0, got {temperature}"
        )));
    }
    if rows.is_empty() {
        return Err(invalid("no rows to score".to_string()));
    }
    let config = model.config();
    for (b, row) in rows.iter().enumerate() {
        if row.prompt_ids.is_empty() {
            return Err(invalid(format!(
                "row {b}: the prompt is empty (the first completion token needs a prefix)"
            )));
        }
        if row.len() > config.max_position_embeddings {
            return Err(invalid(format!(
                "row {b}: {} tokens exceed max_position_embeddings = {}",
                row.len(),
                config.max_position_embeddings
            )));
        }
        let all = row.prompt_ids.iter().chain(row.completion_ids);
        if let Some((position, id)) = all
            .enumerate()
            .find(|(_, id)| **id as usize >= config.vocab_size)
        {
            return Err(invalid(format!(
                "row {b}: token id {id} at position {position} is outside the vocabulary \
                 (vocab_size = {})",
                config.vocab_size
            )));
        }
    }
    Ok(())
}

/// `[B, Tc]` 0/1 f32: 1 where `t < completion_len`.
fn completion_mask(
    rows: &[SequenceRow<'_>],
    max_completion: usize,
    device: &Device,
) -> Result<Tensor, TrainError> {
    let mask: Vec<f32> = rows
        .iter()
        .flat_map(|row| {
            (0..max_completion).map(move |t| f32::from(u8::from(t < row.completion_ids.len())))
        })
        .collect();
    Ok(Tensor::from_vec(
        mask,
        (rows.len(), max_completion),
        device,
    )?)
}

/// For each slot `(b, t)` of `[B, Tc]`, the index of its token in the row-major list of scored
/// tokens, or `padding` past the row's completion.
fn padded_slots(rows: &[SequenceRow<'_>], max_completion: usize, padding: usize) -> Vec<u32> {
    let mut slots = Vec::with_capacity(rows.len() * max_completion);
    let mut next = 0u32;
    for row in rows {
        let len = row.completion_ids.len();
        slots.extend(next..next + len as u32);
        slots.extend(std::iter::repeat_n(padding as u32, max_completion - len));
        next += len as u32;
    }
    slots
}

/// Entropy `logsumexp(z) - sum(softmax(z) * z)` of `z = hidden @ head^T` per row, `[N]` f32,
/// a chunk of rows at a time.
/// Entropy of each row of `logits` [rows, vocab] (the soft-capped models' path; no gradient).
fn entropy_of_logits(logits: &Tensor) -> Result<Tensor, TrainError> {
    let logp = stoke_ops::log_softmax(logits, candle_core::D::Minus1)?;
    Ok((logp.exp()? * &logp)?.sum(1)?.neg()?)
}

fn entropy_rows(hidden: &Tensor, head: &Tensor) -> Result<Tensor, TrainError> {
    use rayon::prelude::*;
    let rows = hidden.dim(0)?;
    let vocab = head.dim(0)?;
    let head_t = head.t()?;
    let mut entropy = Vec::with_capacity(rows);
    for start in (0..rows).step_by(ENTROPY_CHUNK_ROWS) {
        let len = ENTROPY_CHUNK_ROWS.min(rows - start);
        let logits: Vec<f32> = hidden
            .narrow(0, start, len)?
            .matmul(&head_t)?
            .flatten_all()?
            .to_vec1()?;
        // One pass per row: H = log Z - sum(e^(x - m) (x - m)) / Z with Z = sum e^(x - m).
        let chunk: Vec<f32> = logits
            .par_chunks(vocab)
            .map(|row| {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                stoke_ops::vexp::dispatch(
                    #[inline(always)]
                    || {
                        let (mut z, mut weighted) = ([0f32; 8], [0f32; 8]);
                        let mut chunks = row.chunks_exact(8);
                        for c in &mut chunks {
                            for l in 0..8 {
                                let x = c[l] - max;
                                let e = stoke_ops::vexp::exp(x);
                                z[l] += e;
                                weighted[l] += e * x;
                            }
                        }
                        let (mut z_sum, mut w_sum) =
                            (z.iter().sum::<f32>(), weighted.iter().sum::<f32>());
                        for &v in chunks.remainder() {
                            let x = v - max;
                            let e = stoke_ops::vexp::exp(x);
                            z_sum += e;
                            w_sum += e * x;
                        }
                        z_sum.ln() - w_sum / z_sum
                    },
                )
            })
            .collect();
        entropy.extend(chunk);
    }
    Ok(Tensor::from_vec(entropy, rows, hidden.device())?)
}
