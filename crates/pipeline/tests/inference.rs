//! The inference module against the single-sequence scorer (`stoke_rollout::score`): reference
//! and recomputed log-probs, per-group temperatures, independence from the token budget, the
//! deep-copied reference, and the no-reference no-op.

use std::path::Path;
use std::sync::Arc;

use candle_core::Device;
use stoke_model::{ModelConfig, Transformer};
use stoke_pipeline::inference::InferenceModule;
use stoke_pipeline::{
    GenerationPermit, GroupTicket, PolicyVersion, RolloutGroup, Sample, ScoredGroup, Task,
};
use stoke_reward::Reference;
use stoke_rollout::FinishReason;
use stoke_rollout::score::{full_sequence_logits, next_token_logprobs};

const VOCAB: usize = 96;
const TOLERANCE: f32 = 1e-5;

fn tiny_model(seed: u64) -> Transformer {
    let json = stoke_train::config::ModelPreset::Nano.config_json(VOCAB, 64);
    let config =
        ModelConfig::from_json_str(&json.to_string(), Path::new("<nano>")).expect("nano config");
    Transformer::init(config, &Device::Cpu, seed).expect("init")
}

/// Deterministic token ids in the vocabulary (a small LCG; the values only need to vary).
fn ids(seed: u64, len: usize) -> Vec<u32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % VOCAB as u64) as u32
        })
        .collect()
}

/// A group with a prompt of `prompt_len` tokens and one sample per entry of `completion_lens`.
fn group(
    group_id: u64,
    prompt_len: usize,
    completion_lens: &[usize],
    temperature: f32,
) -> ScoredGroup {
    let task = Task {
        id: format!("task-{group_id}"),
        prompt: String::new(),
        prompt_ids: ids(group_id * 100, prompt_len),
        reference: Reference::default(),
        reward: 0,
        data: Default::default(),
    };
    let samples = completion_lens
        .iter()
        .enumerate()
        .map(|(i, &len)| Sample {
            completion_ids: ids(group_id * 100 + i as u64 + 1, len),
            rollout_logprobs: vec![-1.0; len],
            token_versions: vec![PolicyVersion(0); len],
            loss_mask: None,
            episode: None,
            text: String::new(),
            finish: FinishReason::Length,
        })
        .collect();
    let rollout = RolloutGroup {
        ticket: GroupTicket {
            group_id,
            task: Arc::new(task),
            permit: GenerationPermit {
                policy_version: PolicyVersion(0),
                update_slot: 0,
                permit_index: group_id,
            },
            temperature,
        },
        samples,
        generate_seconds: 0.0,
    };
    ScoredGroup::new(rollout, Vec::new(), 0.0)
}

/// Groups of different prompt and completion lengths (one empty completion), temperature 1.
fn groups_at_temperature_one() -> Vec<ScoredGroup> {
    vec![
        group(1, 5, &[4, 7, 1], 1.0),
        group(2, 2, &[3, 0], 1.0),
        group(3, 9, &[6, 2, 5, 8], 1.0),
    ]
}

/// The completion part of `stoke_rollout::score` on prompt + completion, at `temperature`.
fn expected_logprobs(model: &Transformer, group: &ScoredGroup, sample: usize) -> Vec<f32> {
    let prompt = &group.rollout.ticket.task.prompt_ids;
    let completion = &group.rollout.samples[sample].completion_ids;
    if completion.is_empty() {
        return Vec::new();
    }
    let sequence: Vec<u32> = prompt.iter().chain(completion).copied().collect();
    let temperature = group.rollout.ticket.temperature;
    let all = if temperature == 1.0 {
        next_token_logprobs(model, &sequence, &Device::Cpu).expect("reference scorer")
    } else {
        // log softmax(logits / T) at each next token, in f64.
        let logits = full_sequence_logits(model, &sequence, &Device::Cpu).expect("logits");
        sequence
            .windows(2)
            .zip(&logits)
            .map(|(pair, row)| {
                let z: Vec<f64> = row.iter().map(|&x| x as f64 / temperature as f64).collect();
                let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + z.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
                (z[pair[1] as usize] - lse) as f32
            })
            .collect()
    };
    all[prompt.len() - 1..].to_vec()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= TOLERANCE, "{what}, token {t}: {g} vs {w}");
    }
}

fn reference_logprobs(groups: &[ScoredGroup]) -> Vec<Vec<Vec<f32>>> {
    groups
        .iter()
        .map(|g| g.ref_logprobs.clone().expect("ref_logprobs filled"))
        .collect()
}

#[test]
fn reference_logprobs_equal_the_single_sequence_scorer() {
    let model = tiny_model(1);
    let inference = InferenceModule::new(Some(model.clone()), 64);
    let mut groups = groups_at_temperature_one();
    inference
        .add_reference_logprobs(&mut groups)
        .expect("scores");
    for (g, group) in groups.iter().enumerate() {
        let got = group.ref_logprobs.as_ref().expect("filled");
        assert_eq!(got.len(), group.rollout.samples.len());
        for (s, row) in got.iter().enumerate() {
            let want = expected_logprobs(&model, group, s);
            assert_close(row, &want, &format!("group {g}, sample {s}"));
        }
        assert!(group.old_logprobs.is_none(), "only ref_logprobs is filled");
    }
    assert!(inference.busy_seconds() > 0.0);
    assert!(groups.iter().all(|g| g.inference_seconds > 0.0));
}

#[test]
fn logprobs_do_not_depend_on_the_token_budget() {
    let model = tiny_model(2);
    let score_with = |budget: usize| {
        let mut groups = groups_at_temperature_one();
        InferenceModule::new(Some(model.clone()), budget)
            .add_reference_logprobs(&mut groups)
            .expect("scores");
        reference_logprobs(&groups)
    };
    // One row per forward, a few rows per forward, everything in one forward.
    let one_by_one = score_with(1);
    for budget in [40, 100_000] {
        let batched = score_with(budget);
        for (g, (a, b)) in one_by_one.iter().zip(&batched).enumerate() {
            for (s, (a, b)) in a.iter().zip(b).enumerate() {
                assert_close(b, a, &format!("budget {budget}, group {g}, sample {s}"));
            }
        }
    }
}

#[test]
fn each_group_is_scored_at_its_own_temperature() {
    let model = tiny_model(3);
    let inference = InferenceModule::new(Some(model.clone()), 10_000);
    let mut groups = vec![
        group(1, 4, &[5, 3], 0.7),
        group(2, 6, &[4], 1.0),
        group(3, 3, &[6, 2], 1.6),
    ];
    inference
        .add_reference_logprobs(&mut groups)
        .expect("scores");
    for (g, group) in groups.iter().enumerate() {
        for (s, row) in group
            .ref_logprobs
            .as_ref()
            .expect("filled")
            .iter()
            .enumerate()
        {
            let want = expected_logprobs(&model, group, s);
            assert_close(
                row,
                &want,
                &format!("group {g} (T = {})", group.rollout.ticket.temperature),
            );
        }
    }
    // The temperature matters: the same rows at T = 1 differ from T = 0.7.
    let at_one = {
        let mut same = vec![group(1, 4, &[5, 3], 1.0)];
        inference.add_reference_logprobs(&mut same).expect("scores");
        reference_logprobs(&same).remove(0)
    };
    let at_07 = &groups[0].ref_logprobs.as_ref().expect("filled")[0];
    assert!((at_one[0][0] - at_07[0]).abs() > 1e-3);
}

#[test]
fn recomputed_logprobs_use_the_given_policy_and_record_its_version() {
    let reference = tiny_model(4);
    let policy = tiny_model(5);
    let inference = InferenceModule::new(Some(reference), 64);
    let mut groups = groups_at_temperature_one();
    inference
        .add_recomputed_logprobs(&policy, PolicyVersion(7), &mut groups)
        .expect("scores");
    for group in &groups {
        assert_eq!(group.old_version, Some(PolicyVersion(7)));
        assert!(group.ref_logprobs.is_none());
        for (s, row) in group
            .old_logprobs
            .as_ref()
            .expect("filled")
            .iter()
            .enumerate()
        {
            assert_close(row, &expected_logprobs(&policy, group, s), "recomputed");
        }
    }
}

#[test]
fn without_a_reference_reference_logprobs_are_a_no_op() {
    let inference = InferenceModule::new(None, 64);
    assert!(!inference.has_reference());
    let mut groups = groups_at_temperature_one();
    inference
        .add_reference_logprobs(&mut groups)
        .expect("no-op");
    assert!(groups.iter().all(|g| g.ref_logprobs.is_none()));
    assert_eq!(inference.busy_seconds(), 0.0);
}

#[test]
fn reset_reference_copies_the_weights() {
    let policy = tiny_model(6);
    let mut inference = InferenceModule::new(None, 64);
    inference.reset_reference(&policy).expect("reset");
    assert!(inference.has_reference());

    let mut before = groups_at_temperature_one();
    inference
        .add_reference_logprobs(&mut before)
        .expect("scores");

    // An in-place update of every policy parameter, as the optimizer does.
    for (name, var) in policy.parameters() {
        let shifted = (var.as_tensor() * 1.5).expect("scale");
        var.set(&shifted)
            .unwrap_or_else(|e| panic!("set {name}: {e}"));
    }
    let mut after = groups_at_temperature_one();
    inference
        .add_reference_logprobs(&mut after)
        .expect("scores");
    assert_eq!(reference_logprobs(&before), reference_logprobs(&after));

    // The update did change the policy, so the equality above is the copy's doing.
    let mut under_policy = groups_at_temperature_one();
    inference
        .add_recomputed_logprobs(&policy, PolicyVersion(1), &mut under_policy)
        .expect("scores");
    let changed = under_policy[0].old_logprobs.as_ref().expect("filled")[0][0];
    let reference = reference_logprobs(&before)[0][0][0];
    assert!(
        (changed - reference).abs() > 1e-4,
        "{changed} vs {reference}"
    );
}

#[test]
fn a_bad_row_is_named_by_its_task_and_changes_nothing() {
    let model = tiny_model(7);
    let inference = InferenceModule::new(Some(model), 64);
    let mut groups = groups_at_temperature_one();
    groups[1].rollout.samples[0].completion_ids[0] = VOCAB as u32 + 3;
    let error = inference
        .add_reference_logprobs(&mut groups)
        .expect_err("out-of-vocabulary token");
    let message = error.to_string();
    assert!(
        message.contains("task-2") && message.contains("sample 0"),
        "{message}"
    );
    assert!(groups.iter().all(|g| g.ref_logprobs.is_none()));
}
