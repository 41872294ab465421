//! Objectives: small types that turn a micro-batch into a differentiable loss *sum* and the
//! figures that go with it. The trainer loop owns everything else (accumulation, clipping,
//! schedules, checkpoints).
//!
//! Normalisation contract: an objective returns the loss summed over the micro-batch's loss
//! tokens and says how many tokens that is ([`Objective::loss_tokens`] is answered before any
//! forward pass). The trainer divides every micro-batch's sum by the total token count of the
//! whole optimizer step, so accumulating micro-batches equals one large batch.
//!
//! [`NextTokenObjective`] serves pretraining and SFT alike (SFT differs only in which targets the
//! batch's loss mask keeps): a forward with the block-diagonal document mask and the batch's
//! per-document position ids, the LM head applied to the loss positions only, optional logit
//! soft-capping `c * tanh(logits / c)`, cross-entropy from the fused `stoke_ops::token_logprobs`,
//! and optional z-loss `coef * logsumexp(logits)^2` per token (PaLM), summed like the
//! cross-entropy so it normalises the same way.
//!
//! What this is not: no optimizer, no data reading, no micro-batch loop. The trainer runs these
//! objectives through [`crate::step::accumulate`], the loop generic over the batch type that the
//! preference objectives (pairs, `preference::train`) and GRPO's loss (groups,
//! `grpo::update`) run through too.

use candle_core::{D, DType, Device, Tensor};
use stoke_data::packing::PackedBatch;
use stoke_model::{Transformer, document_causal_bias};

use crate::error::TrainError;

/// A micro-batch's loss, summed over its loss tokens (not yet normalised).
#[derive(Debug)]
pub struct ObjectiveOutput {
    /// Differentiable scalar: sum over loss tokens of (cross-entropy + z-loss term).
    pub loss_sum: Tensor,
    /// Sum of the objective's per-token loss in nats without the z-loss term, for metrics:
    /// the cross-entropy, or the divergence to the teacher under distillation.
    pub nll_sum: f64,
    /// Sum of the z-loss terms (already multiplied by the coefficient); 0 when off.
    pub z_loss_sum: f64,
    /// Number of tokens the sums run over.
    pub loss_tokens: usize,
    /// What the forward pass recorded besides the loss (MoE routing, attention logits).
    pub figures: ForwardFigures,
}

/// A micro-batch's figures from inside the model: mixture-of-experts routing and the largest
/// attention logits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardFigures {
    /// Sum of the auxiliary load-balancing terms (already times the coefficient, and times the
    /// loss tokens, like the other sums); 0 when the aux loss is off.
    pub aux_loss_sum: f64,
    /// Tokens routed to each expert, per MoE layer: `(layer, counts)`.
    pub expert_counts: Vec<(usize, Vec<u64>)>,
    /// (token, slot) pairs routed over the MoE layers, and those an expert capacity dropped.
    pub routed_pairs: u64,
    pub dropped_pairs: u64,
    /// Each attention layer's per-query-head largest logit, when tracked (MuonClip).
    pub max_logits: Vec<(usize, Vec<f32>)>,
    /// Multi-token prediction: the modules' cross-entropy summed over their predictions
    /// (unweighted), and how many predictions that is (0 when off).
    pub mtp_nll_sum: f64,
    pub mtp_tokens: usize,
}

/// Turns a batch into a loss sum and figures.
pub trait Objective: Send {
    /// Tokens this batch contributes to the step's normaliser; known before any forward pass.
    fn loss_tokens(&self, batch: &PackedBatch) -> usize;
    /// Forward pass and loss. A batch without loss tokens returns a zero loss without a graph.
    fn loss(&self, model: &Transformer, batch: &PackedBatch)
    -> Result<ObjectiveOutput, TrainError>;
    /// Whether the objective adds a z-loss term (so metrics report it).
    fn reports_z_loss(&self) -> bool {
        false
    }
}

/// Next-token cross-entropy over the loss-masked targets of packed batches.
#[derive(Clone, Debug, PartialEq)]
pub struct NextTokenObjective {
    /// z-loss coefficient (PaLM uses 1e-4); 0 turns it off.
    pub z_loss: f64,
    /// Logit soft-cap `c` (Gemma 2 uses 30); `None` turns it off.
    pub logit_softcap: Option<f64>,
    /// Weight of HF's auxiliary load-balancing loss for MoE models (`None`: off).
    pub moe_aux_loss_coef: Option<f64>,
    /// Track each attention head's largest logit (MuonClip's QK-clip needs them).
    pub track_max_logits: bool,
    /// Weight λ of the multi-token prediction loss (models with MTP modules; 0: off).
    pub mtp_loss_weight: f64,
}

impl NextTokenObjective {
    pub fn plain() -> NextTokenObjective {
        NextTokenObjective {
            z_loss: 0.0,
            logit_softcap: None,
            moe_aux_loss_coef: None,
            track_max_logits: false,
            mtp_loss_weight: 0.0,
        }
    }
}

impl Objective for NextTokenObjective {
    fn loss_tokens(&self, batch: &PackedBatch) -> usize {
        batch.num_loss_tokens()
    }

    fn loss(
        &self,
        model: &Transformer,
        batch: &PackedBatch,
    ) -> Result<ObjectiveOutput, TrainError> {
        let device = model.device().clone();
        let keep_logits = self.z_loss > 0.0;
        let Some(scored) = score_loss_tokens_tracked(
            model,
            batch,
            self.logit_softcap,
            keep_logits,
            self.track_max_logits,
            true,
        )?
        else {
            return Ok(ObjectiveOutput {
                loss_sum: Tensor::zeros((), DType::F32, &device)?,
                nll_sum: 0.0,
                z_loss_sum: 0.0,
                loss_tokens: 0,
                figures: ForwardFigures::default(),
            });
        };
        let nll_total = match &scored.logprob_sum {
            Some(sum) => sum.neg()?,
            None => scored.logprobs.neg()?.sum_all()?,
        };
        let nll_sum = scalar(&nll_total)?;
        // `keep_logits` above: the logits are there whenever the z-loss is on.
        let loss_tokens = scored.targets.dim(0)?;
        let (mut figures, aux_total) = moe_record(
            model,
            batch,
            &scored.routings,
            self.moe_aux_loss_coef,
            loss_tokens,
        )?;
        figures.max_logits = scored.max_logits.clone();
        let nll_total = match aux_total {
            Some(aux) => (nll_total + aux)?,
            None => nll_total,
        };
        let nll_total = if self.mtp_loss_weight > 0.0 && model.num_mtp_modules() > 0 {
            let (term, nll, count) =
                mtp_loss_term(model, batch, &scored.hidden, self.mtp_loss_weight)?;
            figures.mtp_nll_sum = nll;
            figures.mtp_tokens = count;
            match term {
                Some(term) => (nll_total + term)?,
                None => nll_total,
            }
        } else {
            nll_total
        };
        let (loss_sum, z_loss_sum) = if self.z_loss > 0.0
            && let Some(logits) = scored.logits.as_ref()
        {
            // logsumexp = logit[target] - log p(target): reuses the fused kernel's output, and
            // the gather keeps it differentiable without a second softmax pass.
            let target_logits = logits
                .gather(&scored.targets.unsqueeze(1)?, 1)?
                .squeeze(1)?;
            let lse = (target_logits - &scored.logprobs)?;
            let z_total = (lse.sqr()?.sum_all()? * self.z_loss)?;
            let z_sum = scalar(&z_total)?;
            ((nll_total + z_total)?, z_sum)
        } else {
            (nll_total, 0.0)
        };
        Ok(ObjectiveOutput {
            loss_sum,
            nll_sum,
            z_loss_sum,
            loss_tokens,
            figures,
        })
    }

    fn reports_z_loss(&self) -> bool {
        self.z_loss > 0.0
    }
}

/// The MoE figures of a micro-batch from what its MoE layers routed, and the auxiliary loss
/// term to add to the loss sum when `aux_loss_coef` is set: `coef * aux * loss_tokens`, so that
/// the trainer's division by the step's loss tokens weighs each micro-batch's aux loss by its
/// share of them (one micro-batch: exactly `coef * aux`, as transformers adds it). The aux loss
/// runs over the batch's real positions (padding excluded).
pub fn moe_record(
    model: &Transformer,
    batch: &PackedBatch,
    routings: &[stoke_model::moe::Routing],
    aux_loss_coef: Option<f64>,
    loss_tokens: usize,
) -> Result<(ForwardFigures, Option<Tensor>), TrainError> {
    let Some(moe) = model.config().moe.as_ref() else {
        return Ok((ForwardFigures::default(), None));
    };
    let expert_counts = routings
        .iter()
        .map(|r| (r.layer, r.counts(moe.num_experts)))
        .collect();
    let mut record = ForwardFigures {
        aux_loss_sum: 0.0,
        expert_counts,
        routed_pairs: routings.iter().map(|r| r.chosen.len() as u64).sum(),
        dropped_pairs: routings.iter().map(|r| r.dropped).sum(),
        ..ForwardFigures::default()
    };
    let Some(coef) = aux_loss_coef else {
        return Ok((record, None));
    };
    let mask: Vec<f32> = batch
        .doc_ids
        .iter()
        .map(|&d| {
            if d == stoke_data::packing::PAD_DOC {
                0.0
            } else {
                1.0
            }
        })
        .collect();
    let Some(aux) = stoke_model::moe::load_balancing_loss(routings, moe.num_experts, Some(&mask))?
    else {
        return Ok((record, None));
    };
    let term = (aux.to_dtype(DType::F32)? * (coef * loss_tokens as f64))?;
    record.aux_loss_sum = scalar(&term)?;
    Ok((record, Some(term)))
}

/// The multi-token prediction loss of a packed batch (DeepSeek-V3 §2.2): module d's entry i
/// joins the hidden state at i (the main model's, then the previous module's) with the
/// embedding of token i + 1 + d at the next position, and is scored on token i + 2 + d where
/// that token is a loss target of the same document. Returns the differentiable term
/// `weight / modules * sum of cross-entropies` (each prediction weighs like a main-loss token
/// times λ / D, and the trainer's division by the step's loss tokens makes it DeepSeek's
/// λ / D · Σ_d mean_d up to the few positions the shift loses), the unweighted sum, and the
/// number of predictions.
pub fn mtp_loss_term(
    model: &Transformer,
    batch: &PackedBatch,
    hidden: &Tensor,
    weight: f64,
) -> Result<(Option<Tensor>, f64, usize), TrainError> {
    let device = model.device();
    let (rows, len) = (batch.batch_size, batch.seq_len);
    let width = hidden.dim(D::Minus1)?;
    let (_, positions, bias) = batch_inputs(batch, device)?;
    let modules = model.num_mtp_modules();
    let mut previous = hidden.reshape((rows, len, width))?;
    let (mut total, mut nll_sum, mut count): (Option<Tensor>, f64, usize) = (None, 0.0, 0);
    for depth in 0..modules {
        let shift = 1 + depth;
        // Entry i reads token i + 1 + d = targets[i + d]; past the row's end, a pad (the entry
        // is never scored, and only other unscored entries of its document attend to it).
        let mut next = Vec::with_capacity(rows * len);
        let (mut picked, mut targets) = (Vec::new(), Vec::new());
        for r in 0..rows {
            for i in 0..len {
                let at = r * len + i;
                next.push(if i + depth < len {
                    batch.targets[at + depth]
                } else {
                    0
                });
                let scored_at = at + shift;
                if i + shift < len
                    && batch.doc_ids[at] != stoke_data::packing::PAD_DOC
                    && batch.doc_ids[scored_at] == batch.doc_ids[at]
                    && batch.loss_mask[scored_at]
                {
                    picked.push(at as u32);
                    targets.push(batch.targets[scored_at]);
                }
            }
        }
        let next = Tensor::from_vec(next, (rows, len), device)?;
        let shifted = (positions.to_dtype(DType::F32)? + shift as f64)?.to_dtype(DType::U32)?;
        let out = model.mtp_hidden(depth, &previous, &next, &shifted, &bias, None)?;
        if !picked.is_empty() {
            let n = picked.len();
            let index = Tensor::from_vec(picked, n, device)?;
            let chosen = out.reshape((rows * len, width))?.index_select(&index, 0)?;
            let targets = Tensor::from_vec(targets, n, device)?;
            let logprobs = if model.config().final_logit_softcap.is_some() {
                stoke_ops::token_logprobs(&model.lm_logits(&chosen)?, &targets)?
            } else {
                crate::lm_head_logprobs(model, &chosen, model.lm_head_weight(), &targets)?
            };
            let nll = logprobs.neg()?.sum_all()?;
            nll_sum += scalar(&nll)?;
            count += n;
            total = Some(match total {
                Some(t) => (t + nll)?,
                None => nll,
            });
        }
        previous = out;
    }
    let term = match total {
        Some(t) => Some((t.to_dtype(DType::F32)? * (weight / modules as f64))?),
        None => None,
    };
    Ok((term, nll_sum, count))
}

/// Logit distillation over packed batches (`[distill]`): at every loss position, the generalized
/// JSD (`stoke_ops::distill`, TRL's `generalized_jsd_loss`) between the student's and the
/// teacher's next-token distributions, summed like the cross-entropy (the trainer divides by
/// the step's loss tokens, TRL's `num_items_in_batch` normalisation). The teacher's logits exist
/// for one micro-batch's loss positions at a time, without gradients.
///
/// With [`OnPolicySampling`] (GKD's `lmbda`), a drawn share of micro-batches trains on the
/// student's own completions of the batch's prompts instead of the data's.
pub struct DistillObjective {
    pub teacher: Teacher,
    pub beta: f64,
    pub temperature: f64,
    pub on_policy: Option<OnPolicySampling>,
    /// Weight of the cross-entropy on the data's reply tokens added to the divergence
    /// (`[distill] ce_weight`); on-policy batches take the divergence alone.
    pub ce_weight: f64,
}

/// Where the teacher's distributions come from.
// One value per run: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Teacher {
    /// A local model, frozen (`Transformer::into_frozen`): its full next-token distributions, or
    /// with `top_k` only its k most likely ids plus the rest-of-mass bucket (what a remote
    /// teacher returns; `stoke_ops::distill::sparse_generalized_jsd`).
    Model {
        model: Transformer,
        top_k: Option<usize>,
    },
    /// The top-k stored with the training data (`stoke distill generate`'s
    /// `[model] top_k_logprobs`), used as given (at the temperature they were taken at).
    Stored(std::sync::Arc<crate::source::teacher_topk::TeacherTopK>),
}

impl Teacher {
    /// A local model's full distributions.
    pub fn model(model: Transformer) -> Teacher {
        Teacher::Model { model, top_k: None }
    }
}

/// GKD's on-policy regime (Agarwal et al. 2024; TRL `GKDTrainer`'s `lmbda`): a micro-batch is
/// drawn on-policy with probability `lmbda`, and then every conversation in it is cut at its first
/// trained token (the prompt: everything before the first assistant reply), the student samples a
/// completion of each prompt (the rollout engine, no gradient), and the divergence to the teacher
/// is taken on the sampled tokens. Only the first assistant turn of a multi-turn conversation is
/// regenerated; a piece that starts inside a reply (a conversation cut across rows) has no prompt
/// and is left out.
///
/// The draw is a hash of the seed and the batch's tokens, so a resumed run draws exactly as the
/// uninterrupted one. The on-policy batch's loss is rescaled to the data batch's token count, so
/// the micro-batch keeps the weight the step's normaliser gave it (a mean over the sampled
/// tokens, weighted like the data batch).
#[derive(Clone, Debug, PartialEq)]
pub struct OnPolicySampling {
    /// Share of micro-batches taken on-policy, in [0, 1].
    pub lmbda: f64,
    pub max_new_tokens: usize,
    /// Sampling temperature (0: greedy).
    pub temperature: f32,
    pub seed: u64,
    /// End-of-sequence ids: a sample ends with (and keeps) the first one it draws.
    pub stop_token_ids: Vec<u32>,
}

impl OnPolicySampling {
    /// The batch's draw in [0, 1): a hash of the seed and its tokens.
    fn draw(&self, batch: &PackedBatch) -> (f64, u64) {
        let mut bytes = Vec::with_capacity(8 + 4 * batch.tokens.len());
        bytes.extend(self.seed.to_le_bytes());
        for token in &batch.tokens {
            bytes.extend(token.to_le_bytes());
        }
        let hash = xxhash_rust::xxh3::xxh3_64(&bytes);
        ((hash >> 11) as f64 / (1u64 << 53) as f64, hash)
    }

    /// Whether this micro-batch is taken on-policy, and the seed of its samples.
    pub fn takes(&self, batch: &PackedBatch) -> Option<u64> {
        let (draw, hash) = self.draw(batch);
        (draw < self.lmbda).then_some(hash)
    }

    /// The batch's prompts (each conversation up to and including the token before its first
    /// trained target), in row and piece order.
    pub fn prompts(batch: &PackedBatch) -> Vec<Vec<u32>> {
        let mut prompts = Vec::new();
        for (r, row) in batch.rows.iter().enumerate() {
            let base = r * batch.seq_len;
            for p in 0..row.pieces.len() {
                let positions: Vec<usize> = (base..base + batch.seq_len)
                    .filter(|&i| batch.doc_ids[i] == p as u32)
                    .collect();
                let Some(&start) = positions.first() else {
                    continue;
                };
                if let Some(&first) = positions.iter().find(|&&i| batch.loss_mask[i])
                    && first > start
                {
                    prompts.push(batch.tokens[start..=first].to_vec());
                }
            }
        }
        prompts
    }

    /// The student's completions of the batch's prompts as a batch of its own (one row per
    /// conversation, the loss on the sampled tokens); `None` when the batch has no prompt.
    pub fn student_batch(
        &self,
        model: &Transformer,
        batch: &PackedBatch,
        seed: u64,
    ) -> Result<Option<PackedBatch>, TrainError> {
        let prompts = Self::prompts(batch);
        let Some(longest) = prompts.iter().map(Vec::len).max() else {
            return Ok(None);
        };
        let room = model
            .config()
            .max_position_embeddings
            .saturating_sub(longest);
        let max_new_tokens = self.max_new_tokens.min(room);
        if max_new_tokens == 0 {
            return Ok(None);
        }
        let request = stoke_rollout::GenerationRequest {
            prompts,
            params: stoke_rollout::SamplingParams {
                max_new_tokens,
                temperature: self.temperature,
                top_k: None,
                top_p: 1.0,
                seed,
                n: 1,
                stop_token_ids: self.stop_token_ids.clone(),
                stop_strings: Vec::new(),
            },
            first_prompt_number: 0,
            streams: None,
        };
        let output = stoke_rollout::Engine::new(model)
            .generate(&request, None)
            .map_err(|e| TrainError::Other(format!("on-policy distillation sampling: {e}")))?;
        let sequences: Vec<(usize, Vec<u32>)> = request
            .prompts
            .iter()
            .zip(&output.completions)
            .map(|(prompt, samples)| {
                let mut tokens = prompt.clone();
                if let Some(sample) = samples.first() {
                    tokens.extend(&sample.token_ids);
                }
                (prompt.len(), tokens)
            })
            .collect();
        Ok(Some(prompt_completion_batch(&sequences)))
    }
}

/// One row per `(prompt length, tokens)`, padded to the longest: next-token targets, the loss on
/// the tokens after the prompt, positions from 0, padding outside every document.
pub fn prompt_completion_batch(sequences: &[(usize, Vec<u32>)]) -> PackedBatch {
    let seq_len = sequences
        .iter()
        .map(|(_, t)| t.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let size = sequences.len() * seq_len;
    let mut batch = PackedBatch {
        batch_size: sequences.len(),
        seq_len,
        tokens: vec![0; size],
        targets: vec![0; size],
        position_ids: vec![0; size],
        doc_ids: vec![stoke_data::packing::PAD_DOC; size],
        loss_mask: vec![false; size],
        rows: Vec::with_capacity(sequences.len()),
    };
    for (r, (prompt_len, tokens)) in sequences.iter().enumerate() {
        let base = r * seq_len;
        for (t, &token) in tokens.iter().enumerate() {
            batch.tokens[base + t] = token;
            batch.position_ids[base + t] = t as u32;
            batch.doc_ids[base + t] = 0;
            if let Some(&next) = tokens.get(t + 1) {
                batch.targets[base + t] = next;
                batch.loss_mask[base + t] = t + 1 >= *prompt_len;
            }
        }
        batch.rows.push(stoke_data::packing::PackedRow {
            pieces: vec![stoke_data::packing::DocPiece {
                doc: r as u64,
                start: 0,
                len: tokens.len() as u32,
            }],
        });
    }
    batch
}

impl Objective for DistillObjective {
    fn loss_tokens(&self, batch: &PackedBatch) -> usize {
        batch.num_loss_tokens()
    }

    fn loss(
        &self,
        model: &Transformer,
        batch: &PackedBatch,
    ) -> Result<ObjectiveOutput, TrainError> {
        let data_tokens = batch.num_loss_tokens();
        let own = match &self.on_policy {
            Some(on_policy) => match on_policy.takes(batch) {
                Some(seed) => on_policy
                    .student_batch(model, batch, seed)?
                    .filter(|own| own.num_loss_tokens() > 0),
                None => None,
            },
            None => None,
        };
        // The student's own samples are not labels: they take the divergence alone.
        let (batch, ce_weight) = match &own {
            Some(own) => (own, 0.0),
            None => (batch, self.ce_weight),
        };
        let output = self.divergence(model, batch, ce_weight)?;
        let tokens = batch.num_loss_tokens();
        if tokens == data_tokens || output.loss_tokens == 0 {
            return Ok(output);
        }
        // The student's own batch: a mean over its sampled tokens, weighted like the data batch.
        let scale = data_tokens as f64 / tokens as f64;
        Ok(ObjectiveOutput {
            loss_sum: (output.loss_sum * scale)?,
            nll_sum: output.nll_sum * scale,
            z_loss_sum: 0.0,
            loss_tokens: data_tokens,
            figures: ForwardFigures::default(),
        })
    }
}

impl DistillObjective {
    /// The summed divergence over `batch`'s loss positions, plus `ce_weight` times the summed
    /// cross-entropy of its targets.
    fn divergence(
        &self,
        model: &Transformer,
        batch: &PackedBatch,
        ce_weight: f64,
    ) -> Result<ObjectiveOutput, TrainError> {
        let Some(student) = score_loss_tokens(model, batch, None, true)? else {
            return Ok(ObjectiveOutput {
                loss_sum: Tensor::zeros((), DType::F32, model.device())?,
                nll_sum: 0.0,
                z_loss_sum: 0.0,
                loss_tokens: 0,
                figures: ForwardFigures::default(),
            });
        };
        let logits = student
            .logits
            .as_ref()
            .ok_or_else(|| TrainError::Other("the student's logits were not kept".into()))?;
        let rows = logits.dim(0)?;
        let sparse = |k: usize, ids: Vec<u32>, logprobs: Vec<f32>| -> Result<Tensor, TrainError> {
            let device = logits.device();
            let ids = Tensor::from_vec(ids, (rows, k), device)?;
            let logprobs = Tensor::from_vec(logprobs, (rows, k), device)?;
            Ok(stoke_ops::distill::sparse_generalized_jsd(
                logits,
                &ids,
                &logprobs,
                self.beta,
                self.temperature,
            )?)
        };
        let divergence = match &self.teacher {
            Teacher::Model {
                model: teacher,
                top_k,
            } => {
                let teacher = score_loss_tokens(teacher, batch, None, true)?
                    .and_then(|t| t.logits)
                    .ok_or_else(|| {
                        TrainError::Other("the teacher scored no loss position".into())
                    })?;
                match top_k {
                    None => stoke_ops::distill::generalized_jsd(
                        logits,
                        &teacher,
                        self.beta,
                        self.temperature,
                    )?,
                    Some(k) => {
                        let k = (*k).min(teacher.dim(1)?);
                        let (ids, logprobs) = top_k_logprobs(&teacher, k, self.temperature)?;
                        sparse(k, ids, logprobs)?
                    }
                }
            }
            Teacher::Stored(table) => {
                let (ids, logprobs) = table
                    .targets(batch)
                    .map_err(|e| TrainError::Other(format!("distill: {e}")))?;
                sparse(table.k, ids, logprobs)?
            }
        };
        let mut loss_sum = divergence.sum_all()?;
        if ce_weight > 0.0 {
            let cross_entropy = student.logprobs.sum_all()?.neg()?;
            loss_sum = (loss_sum + (cross_entropy * ce_weight)?)?;
        }
        Ok(ObjectiveOutput {
            nll_sum: scalar(&loss_sum)?,
            loss_sum,
            z_loss_sum: 0.0,
            loss_tokens: student.targets.dim(0)?,
            figures: ForwardFigures::default(),
        })
    }
}

/// Each row's `k` largest log-probs of `logits / temperature` ([M, V]) and their ids, row-major
/// `[M, k]` (largest first).
pub fn top_k_logprobs(
    logits: &Tensor,
    k: usize,
    temperature: f64,
) -> Result<(Vec<u32>, Vec<f32>), TrainError> {
    use rayon::prelude::*;
    let (rows, vocab) = logits.dims2()?;
    let k = k.min(vocab);
    let values: Vec<f32> = logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    let inverse = (1.0 / temperature) as f32;
    let per_row: Vec<(Vec<u32>, Vec<f32>)> = values
        .par_chunks(vocab.max(1))
        .map(|row| {
            let max = row
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| m.max(x * inverse));
            let lse = max
                + row
                    .iter()
                    .map(|&x| f64::from(x * inverse - max).exp())
                    .sum::<f64>()
                    .ln() as f32;
            let mut order: Vec<u32> = (0..vocab as u32).collect();
            let by_value = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]);
            if k < vocab {
                order.select_nth_unstable_by(k, by_value);
                order.truncate(k);
            }
            order.sort_unstable_by(by_value);
            let logprobs = order
                .iter()
                .map(|&i| row[i as usize] * inverse - lse)
                .collect();
            (order, logprobs)
        })
        .collect();
    let mut ids = Vec::with_capacity(rows * k);
    let mut logprobs = Vec::with_capacity(rows * k);
    for (row_ids, row_logprobs) in per_row {
        ids.extend(row_ids);
        logprobs.extend(row_logprobs);
    }
    Ok((ids, logprobs))
}

/// The loss positions of a batch after a forward pass.
#[derive(Debug)]
pub struct ScoredTokens {
    /// [M, V] logits at the loss positions (soft-capped when asked); kept only when asked for or
    /// soft-capped, since the fused head never materializes them as a graph node.
    pub logits: Option<Tensor>,
    /// [M] u32 targets.
    pub targets: Tensor,
    /// [M] log p(target); plain values outside the graph when `logprob_sum` is set.
    pub logprobs: Tensor,
    /// The sum of `logprobs` as the graph node to differentiate, when asked for (`sum_only`) and
    /// the head is the bf16 one: its gradients are then formed in the forward pass
    /// (`stoke_ops::linear_target_logprob_sum`). None otherwise: differentiate `logprobs`.
    pub logprob_sum: Option<Tensor>,
    /// The target ids, host side (for per-token byte counts in evaluation).
    pub target_ids: Vec<u32>,
    /// What the MoE layers routed (empty for dense models).
    pub routings: Vec<stoke_model::moe::Routing>,
    /// Each attention layer's per-head largest logit (empty unless asked for).
    pub max_logits: Vec<(usize, Vec<f32>)>,
    /// The final-normed hidden states of every position, [B * T, hidden] (what multi-token
    /// prediction starts from).
    pub hidden: Tensor,
}

/// The model's input tensors for a packed batch: ids and positions [B, T] and the
/// block-diagonal causal bias [B, 1, T, T] from the document ids.
pub fn batch_inputs(
    batch: &PackedBatch,
    device: &Device,
) -> Result<(Tensor, Tensor, Tensor), TrainError> {
    let shape = (batch.batch_size, batch.seq_len);
    let ids = Tensor::from_slice(&batch.tokens, shape, device)?;
    let positions = Tensor::from_slice(&batch.position_ids, shape, device)?;
    let doc_rows: Vec<Vec<u32>> = batch
        .doc_ids
        .chunks(batch.seq_len.max(1))
        .map(|row| row.to_vec())
        .collect();
    let bias = document_causal_bias(&doc_rows, device)?;
    Ok((ids, positions, bias))
}

/// Forward pass over `batch` and log-probabilities of its loss-masked targets; `None` when the
/// batch has no loss token. The LM head runs on the loss positions only, which saves most of its
/// cost on SFT batches where only assistant tokens count.
pub fn score_loss_tokens(
    model: &Transformer,
    batch: &PackedBatch,
    logit_softcap: Option<f64>,
    keep_logits: bool,
) -> Result<Option<ScoredTokens>, TrainError> {
    score_loss_tokens_tracked(model, batch, logit_softcap, keep_logits, false, false)
}

/// `score_loss_tokens`, also tracking each attention head's largest logit when
/// `track_max_logits` (MuonClip). With `sum_only` the caller differentiates only the sum of the
/// log-probabilities: a bf16 model's fused head then gives it as `logprob_sum`.
pub fn score_loss_tokens_tracked(
    model: &Transformer,
    batch: &PackedBatch,
    logit_softcap: Option<f64>,
    keep_logits: bool,
    track_max_logits: bool,
    sum_only: bool,
) -> Result<Option<ScoredTokens>, TrainError> {
    let device = model.device();
    let loss_positions: Vec<u32> = batch
        .loss_mask
        .iter()
        .enumerate()
        .filter(|(_, keep)| **keep)
        .map(|(i, _)| i as u32)
        .collect();
    if loss_positions.is_empty() {
        return Ok(None);
    }
    let target_ids: Vec<u32> = loss_positions
        .iter()
        .map(|&i| batch.targets[i as usize])
        .collect();
    let (ids, positions, bias) = batch_inputs(batch, device)?;
    let record = stoke_model::Record {
        routing: model.config().moe.is_some(),
        max_logits: track_max_logits,
    };
    let (hidden, recorded) = if record != stoke_model::Record::default() {
        model.forward_hidden_recorded(&ids, &positions, &bias, record)?
    } else {
        (
            model.forward_hidden(&ids, &positions, &bias, None)?,
            stoke_model::ForwardRecord::default(),
        )
    };
    let (routings, max_logits) = (recorded.routings, recorded.max_logits);
    let width = hidden.dim(D::Minus1)?;
    let all_hidden = hidden.reshape((batch.batch_size * batch.seq_len, width))?;
    let hidden = if loss_positions.len() == batch.loss_mask.len() {
        all_hidden.clone()
    } else {
        let index = Tensor::from_slice(&loss_positions, loss_positions.len(), device)?;
        all_hidden.index_select(&index, 0)?
    };
    let targets = Tensor::from_slice(&target_ids, target_ids.len(), device)?;
    // A model whose own logits are soft-capped (Gemma 2) scores through `lm_logits`, which caps
    // them; the fused head computes `hidden · W^T` only.
    let model_capped = model.config().final_logit_softcap.is_some();
    let (logits, logprobs, logprob_sum) = if keep_logits || logit_softcap.is_some() || model_capped
    {
        let mut logits = model.lm_logits(&hidden)?;
        if let Some(cap) = logit_softcap {
            logits = soft_cap(&logits, cap)?;
        }
        let logprobs = stoke_ops::token_logprobs(&logits, &targets)?;
        (Some(logits), logprobs, None)
    } else if sum_only && model.precision() == stoke_types::Precision::Bf16 {
        // One scalar to differentiate: the bf16 head forms its gradients in the forward pass
        // instead of recomputing every chunk's logits in the backward.
        let head = model.lm_head_weight();
        let (sum, values) =
            stoke_ops::linear_target_logprob_sum(&hidden, head, &targets, model.precision())?;
        let logprobs = Tensor::from_vec(values, target_ids.len(), device)?;
        (None, logprobs, Some(sum))
    } else {
        // The LM head and the target log-probs as one graph node: candle's backward then never
        // zero-fills and accumulates an [M, V] logits gradient (bench/README.md, issue 5).
        let head = model.lm_head_weight();
        let logprobs = crate::lm_head_logprobs(model, &hidden, head, &targets)?;
        (None, logprobs, None)
    };
    Ok(Some(ScoredTokens {
        logits,
        targets,
        logprobs,
        logprob_sum,
        target_ids,
        routings,
        max_logits,
        hidden: all_hidden,
    }))
}

/// `cap * tanh(logits / cap)`: logits stay inside (-cap, cap) and stay differentiable.
pub fn soft_cap(logits: &Tensor, cap: f64) -> Result<Tensor, TrainError> {
    Ok(((logits / cap)?.tanh()? * cap)?)
}

fn scalar(t: &Tensor) -> Result<f64, TrainError> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}
