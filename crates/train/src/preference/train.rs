//! The preference training loop over pairs (DPO family, CPO/SimPO, ORPO): one optimizer step per
//! call, through the shared [`StepEngine`].
//!
//! One step: take the next `pairs_per_micro_batch * micro_batches` pairs (the dataset in a
//! seeded shuffled order, reshuffled every epoch); per micro-batch score them under the policy
//! (one packed sequence per pair by default, see `scoring`), take the reference's values (from
//! the cache, from a live reference model, or none for the reference-free losses), compute the
//! loss, weight it by the micro-batch's share of the step's pairs, backpropagate and add the
//! gradients (with `shards > 1`, the micro-batch's pairs are scored and backpropagated as shards
//! at once, one per thread: see `shards`). The engine then applies the non-finite guard,
//! clipping, the schedule and the optimizer step. Metrics are the same pair-weighted means of the
//! micro-batches' figures.
//!
//! TR-DPO (Gorbatovski et al. 2024): with a live reference and `sync_steps = n`, after every
//! n-th step the reference becomes `alpha * policy + (1 - alpha) * reference` (TRL's
//! `ref_model_mixup_alpha`, 0.6, and `ref_model_sync_steps`, 512).
//!
//! Determinism: the order, the batches and everything the loss sees depend on the data, the
//! seed and computed values only.

use std::time::Instant;

use candle_core::backprop::GradStore;
use stoke_data::epoch::{EpochCursor, EpochPosition, Shuffle};
use stoke_model::Transformer;

use super::data::LabelledCompletion;
use super::data::PreferencePair;
use super::scoring::{PairReference, pair_logps, reference_logps, score_reference};
use super::shards::ShardedLogps;
use super::{
    CpoLoss, DpoLoss, KtoInputs, KtoLoss, OrpoLoss, PreferenceOutput, RewardModelLoss,
    SequenceLogps, invalid,
};
use crate::error::TrainError;
use crate::grpo::ScoringLayout;
use crate::step::{MicroLoss, SplitBackward, StepEngine, StepOutcome, accumulate};

/// The loss a run trains with. KTO runs on unpaired examples, which the loop holds as pairs
/// `(completion, mismatched completion)` with a label (see [`PairTrainer::kto`]).
#[derive(Clone, Debug, PartialEq)]
pub enum PairObjective {
    Dpo(DpoLoss),
    Cpo(CpoLoss),
    Orpo(OrpoLoss),
    Kto(KtoLoss),
    /// A Bradley-Terry reward model: the model is a sequence classifier and each response
    /// (after its prompt) is scored on its own row; no reference.
    RewardModel(RewardModelLoss),
}

impl PairObjective {
    pub fn validate(&self) -> Result<(), TrainError> {
        match self {
            PairObjective::Dpo(loss) => loss.validate(),
            PairObjective::Cpo(loss) => loss.validate(),
            PairObjective::Orpo(loss) => loss.validate(),
            PairObjective::Kto(loss) => loss.validate(),
            PairObjective::RewardModel(loss) => loss.validate(),
        }
    }

    /// Whether the loss reads reference log-probs.
    pub fn needs_reference(&self) -> bool {
        match self {
            PairObjective::Dpo(loss) => loss.needs_reference(),
            PairObjective::Kto(_) => true,
            PairObjective::Cpo(_) | PairObjective::Orpo(_) | PairObjective::RewardModel(_) => false,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            PairObjective::Dpo(_) => "dpo",
            PairObjective::Cpo(_) => "cpo",
            PairObjective::Orpo(_) => "orpo",
            PairObjective::Kto(_) => "kto",
            PairObjective::RewardModel(_) => "reward_model",
        }
    }

    /// The loss of a micro-batch. For KTO, `labels` are the examples' labels and the rows are
    /// `[completions; mismatched completions]`.
    pub fn loss(
        &self,
        policy: &SequenceLogps,
        reference: Option<&SequenceLogps>,
        labels: Option<&[bool]>,
    ) -> Result<PreferenceOutput, TrainError> {
        match self {
            PairObjective::Kto(loss) => {
                let (Some(reference), Some(labels)) = (reference, labels) else {
                    return Err(invalid(
                        "reference",
                        "KTO needs reference log-probs and labels".into(),
                    ));
                };
                let [policy, policy_kl] = policy.split_halves()?;
                let [reference, reference_kl] = reference.split_halves()?;
                let policy_kl = policy_kl.detached();
                loss.loss(&KtoInputs {
                    policy: &policy,
                    reference: &reference,
                    labels,
                    mismatched: loss
                        .needs_mismatched()
                        .then_some((&policy_kl, &reference_kl)),
                })
            }
            PairObjective::Dpo(loss) => {
                let owned;
                let reference = match reference {
                    Some(reference) => reference,
                    None if !loss.needs_reference() => {
                        // A lone `sft` term reads no reference; give it zeros of the right shape.
                        owned = SequenceLogps::from_values(
                            vec![0.0; policy.rows()],
                            vec![0.0; policy.rows()],
                            policy.tokens.clone(),
                            policy.shared.device(),
                        )?;
                        &owned
                    }
                    None => {
                        return Err(invalid(
                            "reference",
                            "this DPO loss needs reference log-probs".into(),
                        ));
                    }
                };
                loss.loss(policy, reference)
            }
            PairObjective::Cpo(loss) => loss.loss(policy),
            PairObjective::Orpo(loss) => loss.loss(policy),
            PairObjective::RewardModel(_) => Err(invalid(
                "objective.kind",
                "a reward model trains on sequence scores, not log-probs (PairTrainer::step \
                 scores its pairs)"
                    .into(),
            )),
        }
    }
}

/// Where the reference's log-probs come from.
pub enum Reference {
    /// The loss needs none.
    None,
    /// Precomputed for every pair (index-aligned with the dataset); only the policy is held.
    Cached(Vec<PairReference>),
    /// A second model, scored every step (needed for TR-DPO's sync).
    Live(Box<Transformer>),
}

/// TR-DPO's reference update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReferenceSync {
    pub alpha: f64,
    pub every: u64,
}

/// How steps are made of pairs.
#[derive(Clone, Debug, PartialEq)]
pub struct PairLoopSettings {
    pub pairs_per_micro_batch: usize,
    pub micro_batches: usize,
    pub layout: ScoringLayout,
    pub seed: u64,
    pub sync: Option<ReferenceSync>,
    /// Each micro-batch is scored and backpropagated as this many shards at once, one per
    /// thread (1: the whole micro-batch at once, its operations shared by the threads); see
    /// `shards`. Capped by the pairs of a micro-batch.
    pub shards: usize,
}

/// The figures of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct PairStepReport {
    /// Steps completed, counting this one.
    pub step: u64,
    pub epoch: u64,
    pub outcome: StepOutcome,
    pub loss: f64,
    pub grad_norm: f64,
    pub lr: f64,
    /// Pair-weighted means of the loss's metrics (TRL's names).
    pub metrics: Vec<(&'static str, f64)>,
    pub pairs: usize,
    /// Prompt and response tokens of the step's sequences (each response with its prompt).
    pub tokens: usize,
    pub seconds: f64,
}

impl PairStepReport {
    pub fn metric(&self, name: &str) -> Option<f64> {
        super::find_metric(&self.metrics, name)
    }
}

/// Where the loop is in its data: the epoch and the next position in that epoch's order (the
/// shared epoch cursor's state).
pub type PairCursor = EpochPosition;

/// The loop's state.
pub struct PairTrainer {
    model: Transformer,
    engine: StepEngine,
    objective: PairObjective,
    reference: Reference,
    pairs: Vec<PreferencePair>,
    /// KTO: the label of each example (`pairs[i]` is its completion and a mismatched one).
    labels: Option<Vec<bool>>,
    settings: PairLoopSettings,
    /// The pairs' epoch order: `seed ^ epoch` seeds each epoch's shuffle, no epoch limit.
    order: EpochCursor,
    /// The epoch of the pairs taken last (what the step reports).
    epoch: u64,
}

impl PairTrainer {
    /// Checks that the pieces fit (the error names what is missing).
    pub fn new(
        model: Transformer,
        engine: StepEngine,
        objective: PairObjective,
        reference: Reference,
        pairs: Vec<PreferencePair>,
        settings: PairLoopSettings,
    ) -> Result<PairTrainer, TrainError> {
        objective.validate()?;
        if pairs.is_empty() {
            return Err(invalid("data", "no preference pairs to train on".into()));
        }
        if matches!(objective, PairObjective::Kto(_)) {
            return Err(invalid(
                "objective.kind",
                "KTO trains on labelled completions: build it with PairTrainer::kto".into(),
            ));
        }
        Self::assemble(model, engine, objective, reference, pairs, None, settings)
    }

    /// A KTO run on labelled completions. Example `i`'s mismatched completion (the KL reference
    /// point's sample) is example `i + 1`'s completion after example `i`'s prompt, cyclically in
    /// file order, fixed for the run as TRL fixes it when it builds its KL dataset, so a cached
    /// reference covers it. [`kto_rows`] builds the rows (also for the cache).
    pub fn kto(
        model: Transformer,
        engine: StepEngine,
        loss: KtoLoss,
        reference: Reference,
        examples: &[LabelledCompletion],
        settings: PairLoopSettings,
    ) -> Result<PairTrainer, TrainError> {
        if examples.len() < 2 {
            return Err(invalid(
                "data",
                "KTO needs at least 2 examples (the KL term pairs each prompt with another \
                 example's completion)"
                    .into(),
            ));
        }
        let labels = examples.iter().map(|e| e.label).collect();
        Self::assemble(
            model,
            engine,
            PairObjective::Kto(loss),
            reference,
            kto_rows(examples),
            Some(labels),
            settings,
        )
    }

    fn assemble(
        model: Transformer,
        engine: StepEngine,
        objective: PairObjective,
        reference: Reference,
        pairs: Vec<PreferencePair>,
        labels: Option<Vec<bool>>,
        settings: PairLoopSettings,
    ) -> Result<PairTrainer, TrainError> {
        objective.validate()?;
        if settings.pairs_per_micro_batch == 0 || settings.micro_batches == 0 {
            return Err(invalid(
                "pairs_per_micro_batch",
                "micro-batches need at least one pair, steps at least one micro-batch".into(),
            ));
        }
        if model.is_token_classifier() {
            return Err(invalid(
                "model.path",
                "a token classifier (a process reward model) trains with stoke prm, not on pairs"
                    .into(),
            ));
        }
        if matches!(objective, PairObjective::RewardModel(_)) != model.is_sequence_classifier() {
            return Err(invalid(
                "objective.kind",
                if model.is_sequence_classifier() {
                    "a sequence classifier trains only as a reward model (objective.kind = \
                     \"reward_model\")"
                        .into()
                } else {
                    "a reward model needs a sequence classifier (Transformer::to_sequence_classifier)"
                        .into()
                },
            ));
        }
        match (&reference, objective.needs_reference()) {
            (Reference::None, true) => {
                return Err(invalid(
                    "reference",
                    format!(
                        "the {} loss needs a reference (cached or live)",
                        objective.name()
                    ),
                ));
            }
            (Reference::Cached(entries), _) if entries.len() != pairs.len() => {
                return Err(invalid(
                    "reference",
                    format!(
                        "{} cached reference entries for {} pairs",
                        entries.len(),
                        pairs.len()
                    ),
                ));
            }
            _ => {}
        }
        if let Some(sync) = settings.sync {
            if !matches!(reference, Reference::Live(_)) {
                return Err(invalid(
                    "reference.sync_steps",
                    "TR-DPO's reference sync needs a live reference (mode = \"live\")".into(),
                ));
            }
            if !(sync.alpha > 0.0 && sync.alpha <= 1.0) || sync.every == 0 {
                return Err(invalid(
                    "reference.mixup_alpha",
                    format!(
                        "needs 0 < mixup_alpha <= 1 and sync_steps >= 1, got {} and {}",
                        sync.alpha, sync.every
                    ),
                ));
            }
        }
        let order = EpochCursor::new(
            pairs.len() as u64,
            Shuffle::SeedXorEpoch {
                seed: settings.seed,
            },
            None,
        );
        Ok(PairTrainer {
            model,
            engine,
            objective,
            reference,
            pairs,
            labels,
            settings,
            order,
            epoch: 0,
        })
    }

    pub fn model(&self) -> &Transformer {
        &self.model
    }

    pub fn engine(&self) -> &StepEngine {
        &self.engine
    }

    pub fn reference_model(&self) -> Option<&Transformer> {
        match &self.reference {
            Reference::Live(model) => Some(model),
            _ => None,
        }
    }

    /// The data cursor a checkpoint keeps (`TrainerState.source`): the epoch and the position
    /// in its order (the order itself follows from the seed and the epoch).
    pub fn cursor(&self) -> PairCursor {
        self.order.position()
    }

    /// The step engine (its state goes into checkpoints; its optimizer state is saved beside).
    pub fn engine_mut(&mut self) -> &mut StepEngine {
        &mut self.engine
    }

    /// Continues from a checkpoint: the engine's state and the data cursor (the optimizer
    /// state and the weights are loaded by the caller).
    pub fn restore(
        &mut self,
        engine: crate::step::EngineState,
        cursor: PairCursor,
    ) -> Result<(), TrainError> {
        if cursor.position > self.pairs.len() as u64 {
            return Err(TrainError::Resume(format!(
                "the checkpoint's data cursor is at pair {} of an epoch, but the data has {} \
                 pairs: not the same data",
                cursor.position,
                self.pairs.len()
            )));
        }
        self.engine.restore(engine)?;
        self.epoch = cursor.epoch;
        self.order.seek(cursor);
        Ok(())
    }

    /// The next `n` pair indices, wrapping into a new (reshuffled) epoch.
    fn next_indices(&mut self, n: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let (_, pair) = self.order.next_item().expect("the pair loop has pairs");
            out.push(pair as usize);
        }
        self.epoch = self.order.position().epoch;
        out
    }

    /// One optimizer step (see the module doc).
    pub fn step(&mut self) -> Result<PairStepReport, TrainError> {
        let started = Instant::now();
        let per = self.settings.pairs_per_micro_batch;
        let total = per * self.settings.micro_batches;
        let indices = self.next_indices(total);
        let epoch = self.epoch;
        let mut sums: Vec<(&'static str, f64)> = Vec::new();
        let mut tokens = 0usize;
        let accumulated = accumulate(self.engine.gradients(), indices.chunks(per), |chunk| {
            let batch: Vec<&PreferencePair> = chunk.iter().map(|&i| &self.pairs[i]).collect();
            tokens += batch
                .iter()
                .map(|p| 2 * p.prompt_ids.len() + p.chosen_ids.len() + p.rejected_ids.len())
                .sum::<usize>();
            if let PairObjective::RewardModel(loss) = &self.objective {
                let out = score_pairs(&self.model, loss, &batch)?;
                let weight = chunk.len() as f64 / total as f64;
                add_metrics(&mut sums, &out.metrics, weight);
                let value = out.loss.to_scalar::<f64>()?;
                return Ok(Some(MicroLoss::new(out.loss, value, weight)));
            }
            let sharded = (self.settings.shards > 1 && batch.len() > 1)
                .then(|| {
                    ShardedLogps::score(
                        &self.model,
                        &batch,
                        self.settings.layout,
                        self.settings.shards,
                    )
                })
                .transpose()?;
            let policy = match &sharded {
                Some(sharded) => sharded.policy(),
                None => pair_logps(&self.model, &batch, self.settings.layout)?,
            };
            let reference = match &self.reference {
                Reference::None => None,
                Reference::Cached(entries) => {
                    let picked: Vec<PairReference> = chunk.iter().map(|&i| entries[i]).collect();
                    Some(reference_logps(&batch, &picked, self.model.device())?)
                }
                Reference::Live(model) => {
                    let entries = score_reference(model, &batch, self.settings.layout)?;
                    Some(reference_logps(&batch, &entries, self.model.device())?)
                }
            };
            let labels: Option<Vec<bool>> = self
                .labels
                .as_ref()
                .map(|labels| chunk.iter().map(|&i| labels[i]).collect());
            let out = self
                .objective
                .loss(&policy, reference.as_ref(), labels.as_deref())?;
            let weight = chunk.len() as f64 / total as f64;
            let value = out.loss.to_scalar::<f64>()?;
            add_metrics(&mut sums, &out.metrics, weight);
            let split: Option<SplitBackward> = sharded.map(|sharded| {
                Box::new(move |store: &GradStore| sharded.backward(store)) as SplitBackward
            });
            Ok(Some(MicroLoss {
                loss: out.loss,
                value,
                weight,
                split,
            }))
        })?;
        let loss = accumulated.loss;
        let result = self.engine.finish(loss, accumulated.grads)?;
        if result.outcome == StepOutcome::Applied
            && let Some(sync) = self.settings.sync
            && self.engine.steps().is_multiple_of(sync.every)
            && let Reference::Live(reference) = &self.reference
        {
            mix_into(reference, &self.model, sync.alpha)?;
        }
        if result.stop {
            return Err(TrainError::NonFinite {
                step: self.engine.steps(),
                consecutive: result.consecutive_bad_steps,
                loss,
                grad_norm: result.grad_norm,
            });
        }
        Ok(PairStepReport {
            step: self.engine.steps(),
            epoch,
            outcome: result.outcome,
            loss,
            grad_norm: result.grad_norm,
            lr: result.lr,
            metrics: sums,
            pairs: total,
            tokens,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// Adds `weight` times each of a micro-batch's metrics into the step's sums.
fn add_metrics(sums: &mut Vec<(&'static str, f64)>, metrics: &[(&'static str, f64)], weight: f64) {
    for (name, metric) in metrics {
        match sums.iter_mut().find(|(key, _)| key == name) {
            Some((_, sum)) => *sum += weight * metric,
            None => sums.push((name, weight * metric)),
        }
    }
}

/// A reward model's loss on `pairs`: every response after its prompt on its own row
/// (`[chosen; rejected]`), scored by the classifier; the pairs' margins when any has one (0 for
/// the others).
pub fn score_pairs(
    model: &Transformer,
    loss: &RewardModelLoss,
    pairs: &[&PreferencePair],
) -> Result<PreferenceOutput, TrainError> {
    let rows = pair_rows(pairs);
    let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
    let scores = model.score_sequences(&refs)?;
    loss.loss(&scores, pair_margins(pairs).as_deref())
}

/// A reward model's rows of `pairs`: `[prompt + chosen ...; prompt + rejected ...]`.
pub fn pair_rows(pairs: &[&PreferencePair]) -> Vec<Vec<u32>> {
    let row = |p: &PreferencePair, response: &[u32]| [p.prompt_ids.as_slice(), response].concat();
    pairs
        .iter()
        .map(|p| row(p, &p.chosen_ids))
        .chain(pairs.iter().map(|p| row(p, &p.rejected_ids)))
        .collect()
}

/// The pairs' margins when any has one (0 for the others), else `None`.
pub fn pair_margins(pairs: &[&PreferencePair]) -> Option<Vec<f64>> {
    pairs
        .iter()
        .any(|p| p.margin.is_some())
        .then(|| pairs.iter().map(|p| p.margin.unwrap_or(0.0)).collect())
}

/// KTO examples as the loop's rows: example `i`'s prompt with its completion ("chosen") and
/// with example `i + 1`'s completion ("rejected", the mismatched sample), cyclically.
pub fn kto_rows(examples: &[LabelledCompletion]) -> Vec<PreferencePair> {
    let n = examples.len();
    (0..n)
        .map(|i| PreferencePair {
            prompt_ids: examples[i].prompt_ids.clone(),
            chosen_ids: examples[i].completion_ids.clone(),
            rejected_ids: examples[(i + 1) % n].completion_ids.clone(),
            margin: None,
            line: examples[i].line,
        })
        .collect()
}

/// `reference <- alpha * policy + (1 - alpha) * reference`, parameter by parameter (TR-DPO).
pub fn mix_into(
    reference: &Transformer,
    policy: &Transformer,
    alpha: f64,
) -> Result<(), TrainError> {
    let policy_params = policy.parameters();
    for (name, var) in reference.parameters() {
        let Some((_, source)) = policy_params.iter().find(|(n, _)| *n == name) else {
            return Err(TrainError::Other(format!(
                "reference sync: the policy has no parameter `{name}`"
            )));
        };
        let mixed = ((source.as_tensor() * alpha)? + (var.as_tensor() * (1.0 - alpha))?)?;
        var.set(&mixed)?;
    }
    Ok(())
}
