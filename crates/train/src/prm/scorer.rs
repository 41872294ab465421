//! A trained PRM scoring generated traces step by step: each trace is split into steps
//! (`steps`: empty pieces dropped, repeats marked), the scored steps are laid out exactly as the
//! PRM saw them in training (`data::tokenize_row` with the rule's separator, no truncation), and
//! each step's score is P(good) at its label position (the last token of its separator):
//! `softmax(logits)[1]`. Repeats score 0 (see `steps`).
//!
//! What this is not: no aggregation or advantages (the caller picks a `StepAggregation`, or feeds
//! the step scores to `grpo::process_advantage`), no gradient (scores are detached values).
//! Traces are scored in one batch; the caller bounds its size.

use stoke_model::Transformer;
use stoke_tokenizer::hf::Tokenizer;

use super::PrmError;
use super::data::{StepwiseRow, StepwiseTokenization, tokenize_row};
use super::loss::good_probability;
use super::steps::{Step, StepKind, StepRule, step_scores};

/// One trace's steps and their scores.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoredTrace {
    pub steps: Vec<Step>,
    /// One per step, in order: P(good) from the PRM, 0 for a repeat.
    pub scores: Vec<f64>,
}

/// Scores `traces` (`(prompt, completion)` texts) with `model`, a token classifier with two
/// labels, and its `tokenizer`, splitting each completion by `rule`.
pub fn score_traces(
    model: &Transformer,
    tokenizer: &Tokenizer,
    rule: &StepRule,
    traces: &[(&str, &str)],
) -> Result<Vec<ScoredTrace>, PrmError> {
    if !model.is_token_classifier() || model.config().score_labels != Some(2) {
        return Err(PrmError::Config {
            field: "model",
            message: format!(
                "a process reward model is a token classifier with 2 labels \
                 (*ForTokenClassification, num_labels = 2); this model has {:?} labels{}",
                model.config().score_labels,
                if model.is_token_classifier() {
                    ""
                } else {
                    " and is not a token classifier"
                }
            ),
        });
    }
    let settings = StepwiseTokenization {
        step_separator: rule.separator.clone(),
        max_length: None,
        max_completion_length: None,
        train_on_last_step_only: false,
    };
    let split: Vec<Vec<Step>> = traces
        .iter()
        .map(|(_, completion)| rule.split(completion))
        .collect();
    // The PRM's rows: one per trace with at least one scored step.
    let mut rows = Vec::new();
    let mut owners = Vec::new();
    for (index, ((prompt, _), steps)) in traces.iter().zip(&split).enumerate() {
        let completions: Vec<String> = steps
            .iter()
            .filter(|s| s.kind == StepKind::Scored)
            .map(|s| s.text.clone())
            .collect();
        if completions.is_empty() {
            continue;
        }
        let row = StepwiseRow {
            prompt: prompt.to_string(),
            labels: vec![true; completions.len()],
            completions,
        };
        rows.push(tokenize_row(&row, tokenizer, &settings, true)?);
        owners.push(index);
    }
    let mut scored: Vec<Vec<f64>> = vec![Vec::new(); traces.len()];
    if !rows.is_empty() {
        let ids: Vec<&[u32]> = rows.iter().map(|r| r.input_ids.as_slice()).collect();
        let logits = model.score_tokens(&ids)?.detach();
        let logits: Vec<Vec<Vec<f32>>> = logits.to_dtype(candle_core::DType::F32)?.to_vec3()?;
        for ((row, logits), &owner) in rows.iter().zip(&logits).zip(&owners) {
            scored[owner] = row
                .labels
                .iter()
                .zip(logits)
                .filter(|(label, _)| label.is_some())
                .map(|(_, l)| good_probability(f64::from(l[0]), f64::from(l[1])))
                .collect();
        }
    }
    split
        .into_iter()
        .zip(scored)
        .map(|(steps, scored)| {
            let scores = step_scores(&steps, &scored).ok_or_else(|| {
                PrmError::Shape(format!(
                    "{} step scores for {} scored steps",
                    scored.len(),
                    steps.iter().filter(|s| s.kind == StepKind::Scored).count()
                ))
            })?;
            Ok(ScoredTrace { steps, scores })
        })
        .collect()
}
