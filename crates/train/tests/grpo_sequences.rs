//! `grpo::sequences`: completion log-probs of padded prompt + completion rows against the
//! single-sequence reference scorer (`stoke_rollout::score`), temperature, entropy, padding
//! independence, gradients, and the token-budget split.

mod common;

use candle_core::{DType, Device, Tensor};
use stoke_model::causal_bias;
use stoke_rollout::score::{full_sequence_logits, next_token_logprobs};
use stoke_train::grpo::{SequenceRow, completion_logprobs, token_budget_batches};

use common::{Rng, VOCAB, nano_model};

fn random_ids(rng: &mut Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.below(VOCAB as u64) as u32).collect()
}

/// (prompt, completion) pairs of different lengths, so the batch has padding on both parts.
fn fixture_rows(seed: u64) -> Vec<(Vec<u32>, Vec<u32>)> {
    let mut rng = Rng(seed);
    [(5, 4), (2, 7), (9, 1), (3, 3)]
        .iter()
        .map(|&(p, c)| (random_ids(&mut rng, p), random_ids(&mut rng, c)))
        .collect()
}

fn as_rows(pairs: &[(Vec<u32>, Vec<u32>)]) -> Vec<SequenceRow<'_>> {
    pairs
        .iter()
        .map(|(p, c)| SequenceRow {
            prompt_ids: p,
            completion_ids: c,
        })
        .collect()
}

fn rows_of(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2::<f32>().expect("[B, T] f32")
}

/// log softmax(row / temperature) and its entropy, in f64.
fn tempered(row: &[f32], temperature: f64) -> (Vec<f64>, f64) {
    let z: Vec<f64> = row.iter().map(|&x| x as f64 / temperature).collect();
    let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + z.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
    let logp: Vec<f64> = z.iter().map(|x| x - lse).collect();
    let entropy = -logp.iter().map(|lp| lp.exp() * lp).sum::<f64>();
    (logp, entropy)
}

#[test]
fn logprobs_equal_the_reference_scorer_on_the_completion_part() {
    let model = nano_model(1);
    let pairs = fixture_rows(11);
    let scores = completion_logprobs(&model, &as_rows(&pairs), 1.0, false).expect("scores");
    let got = rows_of(&scores.logprobs);
    let mask = rows_of(&scores.mask);
    assert_eq!(scores.logprobs.dims(), [4, 7]);
    for (b, (prompt, completion)) in pairs.iter().enumerate() {
        let ids: Vec<u32> = prompt.iter().chain(completion).copied().collect();
        let reference = next_token_logprobs(&model, &ids, &Device::Cpu).expect("reference");
        let expected = &reference[prompt.len() - 1..];
        assert_eq!(expected.len(), completion.len());
        for t in 0..7 {
            if t < completion.len() {
                assert_eq!(mask[b][t], 1.0);
                let diff = (got[b][t] - expected[t]).abs();
                assert!(
                    diff < 1e-5,
                    "row {b} token {t}: {} vs {}",
                    got[b][t],
                    expected[t]
                );
            } else {
                assert_eq!(mask[b][t], 0.0, "row {b} slot {t} is padding");
                assert_eq!(got[b][t], 0.0, "row {b} padding slot {t} holds exactly 0");
            }
        }
    }
}

#[test]
fn logprob_rows_drop_the_padding() {
    let model = nano_model(6);
    let pairs = fixture_rows(16);
    let scores = completion_logprobs(&model, &as_rows(&pairs), 1.0, false).expect("scores");
    let padded = rows_of(&scores.logprobs);
    let rows = scores.logprob_rows().expect("rows");
    assert_eq!(rows.len(), pairs.len());
    for (b, (row, (_, completion))) in rows.iter().zip(&pairs).enumerate() {
        assert_eq!(row.len(), completion.len(), "row {b}");
        assert_eq!(row[..], padded[b][..completion.len()], "row {b}");
    }
}

#[test]
fn temperature_scores_logits_over_temperature_and_entropy_matches() {
    let model = nano_model(2);
    let pairs = fixture_rows(12);
    let temperature = 0.6;
    let scores =
        completion_logprobs(&model, &as_rows(&pairs), temperature as f32, true).expect("scores");
    let got = rows_of(&scores.logprobs);
    let entropy = rows_of(scores.entropy.as_ref().expect("entropy asked for"));
    let mut max_gap_to_plain = 0.0f64;
    for (b, (prompt, completion)) in pairs.iter().enumerate() {
        let ids: Vec<u32> = prompt.iter().chain(completion).copied().collect();
        let logits = full_sequence_logits(&model, &ids, &Device::Cpu).expect("logits");
        let plain = next_token_logprobs(&model, &ids, &Device::Cpu).expect("plain");
        for (t, &token) in completion.iter().enumerate() {
            let position = prompt.len() - 1 + t;
            let (logp, h) = tempered(&logits[position], temperature);
            let diff = (got[b][t] as f64 - logp[token as usize]).abs();
            assert!(
                diff < 1e-5,
                "row {b} token {t}: {} vs {}",
                got[b][t],
                logp[token as usize]
            );
            let diff = (entropy[b][t] as f64 - h).abs();
            assert!(diff < 1e-4, "row {b} entropy {t}: {} vs {h}", entropy[b][t]);
            max_gap_to_plain = max_gap_to_plain.max((got[b][t] - plain[position]).abs() as f64);
        }
        assert!(entropy[b][completion.len()..].iter().all(|&h| h == 0.0));
    }
    assert!(
        max_gap_to_plain > 1e-3,
        "temperature had no effect ({max_gap_to_plain})"
    );
}

#[test]
fn a_rows_logprobs_do_not_depend_on_the_other_rows() {
    let model = nano_model(3);
    let pairs = fixture_rows(13);
    let batched = rows_of(
        &completion_logprobs(&model, &as_rows(&pairs), 1.0, false)
            .expect("batch")
            .logprobs,
    );
    // Row 2 has the shortest completion: alone it has no padding at all.
    for (b, pair) in pairs.iter().enumerate() {
        let alone = completion_logprobs(&model, &as_rows(std::slice::from_ref(pair)), 1.0, false)
            .expect("alone");
        let alone = rows_of(&alone.logprobs);
        for (t, value) in alone[0].iter().enumerate() {
            let diff = (batched[b][t] - value).abs();
            assert!(
                diff < 1e-5,
                "row {b} token {t}: {} batched vs {value} alone",
                batched[b][t]
            );
        }
    }
}

#[test]
fn gradients_reach_the_model_and_match_the_unfused_head_at_a_temperature() {
    let model = nano_model(4);
    let pairs = fixture_rows(14);
    let temperature = 0.7f64;
    let scores =
        completion_logprobs(&model, &as_rows(&pairs), temperature as f32, false).expect("scores");
    let grads = scores
        .logprobs
        .sum_all()
        .and_then(|s| s.backward())
        .expect("backward");

    // The same objective through the plain head: logits / T, explicit log-softmax, gather.
    let (batch, seq_len) = (pairs.len(), 10);
    let mut ids = vec![0u32; batch * seq_len];
    let mut valid = vec![vec![false; seq_len]; batch];
    let mut picks = Vec::new();
    for (b, (p, c)) in pairs.iter().enumerate() {
        let row: Vec<u32> = p.iter().chain(c).copied().collect();
        ids[b * seq_len..b * seq_len + row.len()].copy_from_slice(&row);
        valid[b][..row.len()].fill(true);
        for (t, &token) in c.iter().enumerate() {
            picks.push(((b * seq_len + p.len() - 1 + t) as u32, token));
        }
    }
    let dev = Device::Cpu;
    let ids = Tensor::from_vec(ids, (batch, seq_len), &dev).unwrap();
    let positions: Vec<u32> = (0..batch).flat_map(|_| 0..seq_len as u32).collect();
    let positions = Tensor::from_vec(positions, (batch, seq_len), &dev).unwrap();
    let bias = causal_bias(&valid, seq_len, &dev).unwrap();
    let logits = model.forward(&ids, &positions, &bias, None).unwrap();
    let logits = (logits.reshape((batch * seq_len, VOCAB)).unwrap() / temperature).unwrap();
    let index: Vec<u32> = picks.iter().map(|p| p.0).collect();
    let index = Tensor::from_vec(index, picks.len(), &dev).unwrap();
    let logits = logits.index_select(&index, 0).unwrap();
    let lse = logits
        .exp()
        .and_then(|e| e.sum_keepdim(1))
        .and_then(|s| s.log())
        .unwrap();
    let targets: Vec<u32> = picks.iter().map(|p| p.1).collect();
    let targets = Tensor::from_vec(targets, picks.len(), &dev).unwrap();
    let picked = logits.gather(&targets.unsqueeze(1).unwrap(), 1).unwrap();
    let reference = (picked - lse).unwrap().sum_all().unwrap();
    let reference_grads = reference.backward().unwrap();

    let mut checked = 0;
    for (name, var) in model.parameters() {
        let got = grads.get(var.as_tensor());
        let want = reference_grads
            .get(var.as_tensor())
            .expect("reference grad");
        let got = got.unwrap_or_else(|| panic!("no gradient reached {name}"));
        let norm = got
            .sqr()
            .and_then(|s| s.sum_all())
            .and_then(|s| s.to_dtype(DType::F64))
            .and_then(|s| s.to_scalar::<f64>())
            .unwrap();
        assert!(norm > 0.0, "zero gradient for {name}");
        let diff = (got - want)
            .unwrap()
            .abs()
            .and_then(|d| d.max_all())
            .and_then(|d| d.to_scalar::<f32>())
            .unwrap();
        assert!(
            diff < 1e-4,
            "{name}: fused and plain gradients differ by {diff}"
        );
        checked += 1;
    }
    assert!(checked > 5);
}

#[test]
fn bad_rows_are_refused_with_the_row_named() {
    let model = nano_model(5);
    let good = [1u32, 2, 3];
    let empty_prompt = [SequenceRow {
        prompt_ids: &[],
        completion_ids: &good,
    }];
    let err = completion_logprobs(&model, &empty_prompt, 1.0, false).unwrap_err();
    assert!(err.to_string().contains("row 0"), "{err}");
    let outside = [VOCAB as u32];
    let rows = [
        SequenceRow {
            prompt_ids: &good,
            completion_ids: &good,
        },
        SequenceRow {
            prompt_ids: &good,
            completion_ids: &outside,
        },
    ];
    let err = completion_logprobs(&model, &rows, 1.0, false).unwrap_err();
    assert!(err.to_string().contains("row 1"), "{err}");
    assert!(err.to_string().contains("vocabulary"), "{err}");
    let err = completion_logprobs(&model, &rows[..1], 0.0, false).unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
    assert!(completion_logprobs(&model, &[], 1.0, false).is_err());
}

#[test]
fn token_budget_batches_respect_the_padded_budget_in_order() {
    // 3 * 4 = 12 fits 12; adding the 6 would make 4 * 6 = 24.
    assert_eq!(
        token_budget_batches(&[4, 3, 4, 6, 2, 20, 1], 12),
        vec![0..3, 3..5, 5..6, 6..7]
    );
    assert_eq!(
        token_budget_batches(&[], 10),
        Vec::<std::ops::Range<usize>>::new()
    );
    assert_eq!(token_budget_batches(&[5, 5], 0), vec![0..1, 1..2]);
    assert_eq!(token_budget_batches(&[5, 5, 5], 1000), vec![0..3]);
    // Every batch stays within the budget unless it is a single row.
    let lengths: Vec<usize> = (0..50).map(|i| 1 + (i * 7919) % 37).collect();
    let batches = token_budget_batches(&lengths, 64);
    assert_eq!(batches.first().map(|r| r.start), Some(0));
    assert_eq!(batches.last().map(|r| r.end), Some(50));
    for pair in batches.windows(2) {
        assert_eq!(pair[0].end, pair[1].start);
    }
    for range in &batches {
        let widest = lengths[range.clone()].iter().max().unwrap();
        assert!(range.len() == 1 || range.len() * widest <= 64, "{range:?}");
    }
}

/// Two groups of completions sharing their prompts (3 and 2 rows), then a row of its own.
fn grouped_rows(seed: u64) -> Vec<(Vec<u32>, Vec<u32>)> {
    let mut rng = Rng(seed);
    let long_prompt = random_ids(&mut rng, 12);
    let short_prompt = random_ids(&mut rng, 3);
    let lone_prompt = random_ids(&mut rng, 6);
    vec![
        (long_prompt.clone(), random_ids(&mut rng, 4)),
        (long_prompt.clone(), random_ids(&mut rng, 1)),
        (long_prompt, random_ids(&mut rng, 6)),
        (short_prompt.clone(), random_ids(&mut rng, 5)),
        (short_prompt, random_ids(&mut rng, 2)),
        (lone_prompt, random_ids(&mut rng, 3)),
    ]
}

fn grads_of(model: &stoke_model::Transformer, loss: &Tensor) -> Vec<Vec<f32>> {
    let store = loss.backward().expect("backward");
    model
        .parameters()
        .iter()
        .map(|(_, var)| {
            store
                .get(var.as_tensor())
                .map(|g| g.flatten_all().unwrap().to_vec1::<f32>().unwrap())
                .unwrap_or_default()
        })
        .collect()
}

#[test]
fn shared_prefix_packing_gives_the_row_layouts_logprobs_entropy_and_gradients() {
    use stoke_train::grpo::{ScoringLayout, completion_logprobs_with};
    let model = nano_model(3);
    let pairs = grouped_rows(21);
    let rows = as_rows(&pairs);
    let separate = completion_logprobs_with(&model, &rows, 0.8, true, ScoringLayout::Rows).unwrap();
    let packed =
        completion_logprobs_with(&model, &rows, 0.8, true, ScoringLayout::SharedPrefix).unwrap();
    assert_eq!(packed.logprobs.dims(), separate.logprobs.dims());
    assert_eq!(rows_of(&packed.mask), rows_of(&separate.mask));
    let close = |a: &Tensor, b: &Tensor, what: &str| {
        for (ra, rb) in rows_of(a).iter().zip(rows_of(b)) {
            for (x, y) in ra.iter().zip(&rb) {
                assert!((x - y).abs() < 1e-5, "{what}: {x} vs {y}");
            }
        }
    };
    close(&packed.logprobs, &separate.logprobs, "log-probs");
    close(
        packed.entropy.as_ref().unwrap(),
        separate.entropy.as_ref().unwrap(),
        "entropy",
    );
    // The same weighted loss has the same gradient in both layouts (the prompt's gradient is
    // the sum over its completions either way).
    let weights = Tensor::new(&[0.7f32, -1.3, 0.4, 2.0, -0.5, 1.1], &Device::Cpu)
        .unwrap()
        .reshape((6, 1))
        .unwrap();
    let loss = |scores: &stoke_train::grpo::CompletionScores| {
        (scores.logprobs.broadcast_mul(&weights).unwrap() * &scores.mask)
            .unwrap()
            .sum_all()
            .unwrap()
    };
    let a = grads_of(&model, &loss(&separate));
    let b = grads_of(&model, &loss(&packed));
    let mut compared = 0;
    for (ga, gb) in a.iter().zip(&b) {
        assert_eq!(ga.len(), gb.len());
        for (x, y) in ga.iter().zip(gb) {
            assert!(
                (x - y).abs() < 1e-4 * (1.0 + x.abs()),
                "gradient {x} vs {y}"
            );
            compared += 1;
        }
    }
    assert!(compared > 1000);
}

#[test]
fn packed_groups_side_by_side_in_one_row_score_as_each_group_alone_bit_for_bit() {
    use stoke_train::grpo::{ScoringLayout, completion_logprobs_with};
    let model = nano_model(3);
    let pairs = grouped_rows(22);
    let rows = as_rows(&pairs);
    // All three groups in one call: one row, the groups at offsets 0, 24 and 36 (their
    // lengths, 23, 10 and 9 tokens, rounded up to the attention's query block).
    let together =
        completion_logprobs_with(&model, &rows, 0.8, true, ScoringLayout::SharedPrefix).unwrap();
    let (logprobs, entropy) = (
        rows_of(&together.logprobs),
        rows_of(together.entropy.as_ref().unwrap()),
    );
    let mut compared = 0;
    for group in [0..3, 3..5, 5..6] {
        let alone = completion_logprobs_with(
            &model,
            &rows[group.clone()],
            0.8,
            true,
            ScoringLayout::SharedPrefix,
        )
        .unwrap();
        for (i, row) in group.clone().enumerate() {
            let len = rows[row].completion_ids.len();
            let bits = |v: &[f32]| v[..len].iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&logprobs[row]),
                bits(&rows_of(&alone.logprobs)[i]),
                "log-probs of row {row}"
            );
            assert_eq!(
                bits(&entropy[row]),
                bits(&rows_of(alone.entropy.as_ref().unwrap())[i]),
                "entropy of row {row}"
            );
            compared += len;
        }
    }
    assert_eq!(compared, 21);
}

#[test]
fn too_many_groups_for_one_row_take_a_padded_row_each_with_the_same_values() {
    use stoke_train::grpo::{ScoringLayout, completion_logprobs_with};
    let model = nano_model(3);
    let mut rng = Rng(23);
    // 40 prompts with two completions each, 50 to 61 tokens a group: one row would be over
    // 2,048 tokens, past the dense mask's limit, so each group gets a padded row of its own.
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..40)
        .flat_map(|g| {
            let prompt = random_ids(&mut rng, 30 + g % 7);
            let first = random_ids(&mut rng, 10 + g % 5);
            let second = random_ids(&mut rng, 10);
            [(prompt.clone(), first), (prompt, second)]
        })
        .collect();
    let rows = as_rows(&pairs);
    let all =
        completion_logprobs_with(&model, &rows, 1.0, false, ScoringLayout::SharedPrefix).unwrap();
    // The first three groups fit one row.
    let few = completion_logprobs_with(&model, &rows[..6], 1.0, false, ScoringLayout::SharedPrefix)
        .unwrap();
    let (all, few) = (rows_of(&all.logprobs), rows_of(&few.logprobs));
    for row in 0..6 {
        let len = rows[row].completion_ids.len();
        let bits = |v: &[f32]| v[..len].iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&all[row]), bits(&few[row]), "row {row}");
    }
}

#[test]
fn a_prompt_with_more_completions_than_packing_can_label_is_an_error_not_a_panic() {
    use stoke_train::grpo::{ScoringLayout, completion_logprobs_with};
    let model = nano_model(3);
    let prompt = [1u32, 2];
    let completion = [3u32];
    let rows: Vec<SequenceRow<'_>> = (0..65_536)
        .map(|_| SequenceRow {
            prompt_ids: &prompt,
            completion_ids: &completion,
        })
        .collect();
    let error = completion_logprobs_with(&model, &rows, 1.0, false, ScoringLayout::SharedPrefix)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("at most 65535 completions per prompt"),
        "{error}"
    );
    assert!(error.contains("rows 0..65536"), "{error}");
}

#[test]
fn the_layout_choice_packs_short_completions_of_long_shared_prompts_only() {
    use stoke_train::grpo::ScoringLayout;
    let model = nano_model(3);
    let mut rng = Rng(5);
    let prompt = random_ids(&mut rng, 40);
    let short: Vec<(Vec<u32>, Vec<u32>)> = (0..8)
        .map(|_| (prompt.clone(), random_ids(&mut rng, 4)))
        .collect();
    let distinct: Vec<(Vec<u32>, Vec<u32>)> = (0..8)
        .map(|_| (random_ids(&mut rng, 40), random_ids(&mut rng, 4)))
        .collect();
    let tiny_prompt = random_ids(&mut rng, 2);
    let long: Vec<(Vec<u32>, Vec<u32>)> = (0..8)
        .map(|_| (tiny_prompt.clone(), random_ids(&mut rng, 60)))
        .collect();
    for masked_only in [false, true] {
        assert_eq!(
            ScoringLayout::choose_for(&model, &as_rows(&short), masked_only),
            ScoringLayout::SharedPrefix
        );
        assert_eq!(
            ScoringLayout::choose_for(&model, &as_rows(&distinct), masked_only),
            ScoringLayout::Rows
        );
    }
    // Long completions of a short prompt: with dense attention packing would make attention
    // quadratic in the packed length for nothing.
    assert_eq!(
        ScoringLayout::choose_for(&model, &as_rows(&long), false),
        ScoringLayout::Rows
    );
    // With attention over the allowed pairs only (the CPU), packing costs the same attention
    // and saves the repeated prompt tokens.
    assert_eq!(
        ScoringLayout::choose_for(&model, &as_rows(&long), true),
        ScoringLayout::SharedPrefix
    );
    assert_eq!(
        ScoringLayout::choose(&model, &as_rows(&long)),
        ScoringLayout::SharedPrefix,
        "the CPU model's choice is the masked-pairs one"
    );
}

/// A model whose logits are soft-capped (Gemma 2's fixture, final cap 4) scores its completions
/// from the capped logits divided by the temperature, as the rollout samples them, in both
/// layouts: log-probs and entropies equal the full forward's, with every logit inside the cap.
#[test]
fn soft_capped_logits_are_scored_as_the_model_gives_them_in_both_layouts() {
    use stoke_train::grpo::{ScoringLayout, completion_logprobs_with};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models/gemma2_softcap_sliding");
    let model = stoke_model::Transformer::load(&dir, &Device::Cpu).expect("gemma2 fixture");
    let cap = model
        .config()
        .final_logit_softcap
        .expect("a soft-capped model");
    let mut rng = Rng(21);
    let vocab = model.config().vocab_size as u64;
    let mut ids = |len: usize| -> Vec<u32> { (0..len).map(|_| rng.below(vocab) as u32).collect() };
    let prompt = ids(6);
    let pairs = vec![
        (prompt.clone(), ids(5)),
        (prompt.clone(), ids(3)),
        (ids(4), ids(6)),
    ];
    let temperature = 0.7;
    for layout in [ScoringLayout::Rows, ScoringLayout::SharedPrefix] {
        let scores =
            completion_logprobs_with(&model, &as_rows(&pairs), temperature as f32, true, layout)
                .expect("scores");
        let got = rows_of(&scores.logprobs);
        let entropy = rows_of(scores.entropy.as_ref().expect("entropy"));
        for (b, (prompt, completion)) in pairs.iter().enumerate() {
            let all: Vec<u32> = prompt.iter().chain(completion).copied().collect();
            let logits = full_sequence_logits(&model, &all, &Device::Cpu).expect("logits");
            for (t, &token) in completion.iter().enumerate() {
                let row = &logits[prompt.len() - 1 + t];
                assert!(
                    row.iter().all(|x| x.abs() < cap as f32),
                    "logits past the cap"
                );
                let (logp, h) = tempered(row, temperature);
                let diff = (got[b][t] as f64 - logp[token as usize]).abs();
                assert!(diff < 1e-5, "{layout:?} row {b} token {t}: diff {diff}");
                let diff = (entropy[b][t] as f64 - h).abs();
                assert!(diff < 1e-4, "{layout:?} row {b} entropy {t}: diff {diff}");
            }
        }
    }
}
