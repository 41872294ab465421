//! Preference training on the tiny Qwen2 fixture (vocab 300, with the Qwen2.5 chat template):
//! reading pair and KTO files (token-space joins, bad lines named by file and line), packed pair
//! scoring equal to separate rows, the reference cache equal to a live reference bit for bit, and
//! a DPO loop that learns to prefer the chosen responses.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::json;
use stoke_model::Transformer;
use stoke_optim::{AdamWConfig, LrSchedule, Optimizer, OptimizerConfig};
use stoke_tokenizer::chat::{ChatMessage, ChatOptions};
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::grpo::ScoringLayout;
use stoke_train::preference::data::{ReadOptions, read_labelled, read_pairs};
use stoke_train::preference::scoring::{
    cache_key, load_cache, pair_logps, reference_logps, save_cache, score_reference,
};
use stoke_train::preference::train::{
    PairLoopSettings, PairObjective, PairTrainer, Reference, mix_into,
};
use stoke_train::preference::{CpoLoss, DpoLoss, DpoLossType, OrpoLoss};
use stoke_train::step::{StepEngine, StepOutcome, StepSettings};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&fixture()).unwrap()
}

fn model() -> Transformer {
    stoke_ops::numerics::init_compute_threads();
    Transformer::load(&fixture(), &Device::Cpu).unwrap()
}

/// Pairs `k`: "add a b" answered with the right sum (chosen) or a wrong one (rejected); every
/// third line uses plain strings instead of messages.
fn pair_lines(count: usize) -> Vec<String> {
    (0..count)
        .map(|k| {
            let (a, b) = (k % 5, (k / 5) % 4);
            let prompt = format!("add {a} {b}");
            let good = format!("sum {}", a + b);
            let bad = format!("sum {} {}", a + b + 1, "no".repeat(k % 3));
            if k % 3 == 2 {
                json!({"prompt": prompt, "chosen": good, "rejected": bad}).to_string()
            } else {
                json!({
                    "prompt": [{"role": "user", "content": prompt}],
                    "chosen": [{"role": "assistant", "content": good}],
                    "rejected": [{"role": "assistant", "content": bad}],
                })
                .to_string()
            }
        })
        .collect()
}

fn write(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

const OPTIONS: ReadOptions = ReadOptions {
    max_len: 160,
    strict: false,
};

#[test]
fn pairs_are_joined_in_token_space_and_bad_lines_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer();
    let mut lines = pair_lines(4);
    lines.push("{not json".into());
    lines.push(json!({"prompt": "add 1 2", "rejected": "sum 4"}).to_string());
    lines.push(json!({"prompt": "add 1 2", "chosen": "sum 3", "rejected": ""}).to_string());
    lines.push(json!({"prompt": "x ".repeat(200), "chosen": "a", "rejected": "b"}).to_string());
    lines.push(
        json!({"prompt": "add", "chosen": [{"role": "user", "content": "hi"}], "rejected": "b"})
            .to_string(),
    );
    let path = write(dir.path(), "pairs.jsonl", &lines);
    let (pairs, report) = read_pairs(&path, &tok, OPTIONS).unwrap();
    assert_eq!(pairs.len(), 4);
    assert_eq!(report.examples, 4);
    let name = path.display().to_string();
    let expected = [
        (5, "not JSON"),
        (6, "missing field `chosen`"),
        (7, "`rejected` is empty"),
        (8, "sequence limit of 160"),
        (9, "`chosen[0]` is a user message"),
    ];
    assert_eq!(report.skipped.len(), expected.len(), "{:?}", report.skipped);
    for (message, (line, reason)) in report.skipped.iter().zip(expected) {
        assert!(
            message.starts_with(&format!("{name}:{line}: ")) && message.contains(reason),
            "{message}"
        );
    }
    // Strict: the first bad line fails the read, naming it.
    let strict = ReadOptions {
        strict: true,
        ..OPTIONS
    };
    let err = read_pairs(&path, &tok, strict).unwrap_err().to_string();
    assert!(err.contains(&format!("{name}:5:")), "{err}");

    // The prompt is exactly what a sampler continues from; each response is appended as ids and
    // ends the assistant turn.
    let options = ChatOptions {
        add_generation_prompt: true,
        ..ChatOptions::default()
    };
    let prompt = tok
        .apply_chat_template(&[ChatMessage::user("add 0 0")], &options)
        .unwrap()
        .ids;
    assert_eq!(pairs[0].prompt_ids, prompt);
    assert_eq!(pairs[0].line, 1);
    let full = tok
        .apply_chat_template(
            &[
                ChatMessage::user("add 0 0"),
                ChatMessage::assistant("sum 0"),
            ],
            &ChatOptions::default(),
        )
        .unwrap();
    let joined: Vec<u32> = [pairs[0].prompt_ids.clone(), pairs[0].chosen_ids.clone()].concat();
    assert_eq!(tok.decode(&joined, false).unwrap(), full.text);
    assert!(
        tok.decode(&pairs[0].chosen_ids, false)
            .unwrap()
            .contains("<|im_end|>")
    );
    // A plain-string line renders as a user/assistant exchange too.
    assert_eq!(
        pairs[2].prompt_ids,
        tok.apply_chat_template(&[ChatMessage::user("add 2 0")], &options)
            .unwrap()
            .ids
    );
}

#[test]
fn kto_labels_must_be_booleans() {
    let dir = tempfile::tempdir().unwrap();
    let lines = vec![
        json!({"prompt": "add 1 1", "completion": "sum 2", "label": true}).to_string(),
        json!({"prompt": "add 1 1", "completion": "sum 3", "label": "false"}).to_string(),
        json!({"prompt": "add 1 1", "completion": "sum 3", "label": false}).to_string(),
        json!({"prompt": "add 1 1", "completion": "sum 3"}).to_string(),
    ];
    let path = write(dir.path(), "kto.jsonl", &lines);
    let (examples, report) = read_labelled(&path, &tokenizer(), OPTIONS).unwrap();
    assert_eq!(
        examples.iter().map(|e| e.label).collect::<Vec<_>>(),
        [true, false]
    );
    assert_eq!(examples[1].line, 3);
    assert_eq!(report.skipped.len(), 2);
    assert!(
        report.skipped[0].contains(":2: `label` must be true or false"),
        "{:?}",
        report
    );
    assert!(
        report.skipped[1].contains(":4: missing field `label`"),
        "{:?}",
        report
    );
}

#[test]
fn a_file_without_a_usable_pair_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "bad.jsonl", &["[]".to_string()]);
    let err = read_pairs(&path, &tokenizer(), OPTIONS)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad.jsonl: no usable example"), "{err}");
    assert!(err.contains(":1: not a JSON object"), "{err}");
}

fn read_fixture_pairs(count: usize) -> Vec<stoke_train::preference::data::PreferencePair> {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "pairs.jsonl", &pair_lines(count));
    read_pairs(&path, &tokenizer(), OPTIONS).unwrap().0
}

#[test]
fn packed_pairs_equal_separate_rows_in_logps_and_gradients() {
    let model = model();
    let pairs = read_fixture_pairs(3);
    let batch: Vec<_> = pairs.iter().collect();
    let loss = DpoLoss::default();
    let reference = reference_logps(
        &batch,
        &score_reference(&model, &batch, ScoringLayout::Rows).unwrap(),
        &Device::Cpu,
    )
    .unwrap();
    let mut results = Vec::new();
    for layout in [ScoringLayout::Rows, ScoringLayout::SharedPrefix] {
        let policy = pair_logps(&model, &batch, layout).unwrap();
        let values = policy.sum_values().unwrap();
        let out = loss.loss(&policy, &reference).unwrap();
        let grads = out.loss.backward().unwrap();
        let grad: Vec<Vec<f32>> = model
            .parameters()
            .iter()
            .map(|(_, v)| {
                grads
                    .get(v.as_tensor())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            })
            .collect();
        results.push((values, grad));
    }
    let (rows, packed) = (&results[0], &results[1]);
    for (a, b) in rows.0.iter().zip(&packed.0) {
        assert!((a - b).abs() < 1e-4 * a.abs().max(1.0), "logps {a} vs {b}");
    }
    let (mut diff, mut scale) = (0f64, 0f64);
    for (a, b) in rows.1.iter().flatten().zip(packed.1.iter().flatten()) {
        diff = diff.max(f64::from((a - b).abs()));
        scale = scale.max(f64::from(a.abs()));
    }
    assert!(scale > 0.0, "no gradient reached the parameters");
    assert!(
        diff <= 1e-4 * scale,
        "gradients differ by {diff} (largest {scale})"
    );
}

#[test]
fn the_cached_reference_equals_the_live_one_bit_for_bit() {
    let scorer = model();
    let pairs = read_fixture_pairs(5);
    let batch: Vec<_> = pairs.iter().collect();
    let live = score_reference(&scorer, &batch, ScoringLayout::SharedPrefix).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = cache_key(&scorer, &pairs).unwrap();
    assert_eq!(load_cache(dir.path(), &key, pairs.len()).unwrap(), None);
    save_cache(dir.path(), &key, &live).unwrap();
    let cached = load_cache(dir.path(), &key, pairs.len()).unwrap().unwrap();
    assert_eq!(cached.len(), live.len());
    for (c, l) in cached.iter().zip(&live) {
        for (x, y) in c
            .chosen
            .iter()
            .chain(&c.rejected)
            .zip(l.chosen.iter().chain(&l.rejected))
        {
            assert_eq!(x.to_bits(), y.to_bits());
        }
    }
    // The key follows the data and the weights.
    assert_ne!(cache_key(&scorer, &pairs[1..]).unwrap(), key);
    let other = model();
    let (_, var) = &other.parameters()[0];
    var.set(&(var.as_tensor() * 1.5).unwrap()).unwrap();
    assert_ne!(cache_key(&other, &pairs).unwrap(), key);
    let bf16 = model().with_precision(stoke_types::Precision::Bf16);
    assert_ne!(
        cache_key(&bf16, &pairs).unwrap(),
        key,
        "precision is part of the key"
    );
    // A cache for another dataset size is an error, not silently reused.
    assert!(load_cache(dir.path(), &key, pairs.len() + 1).is_err());
}

fn engine(model: &Transformer, lr: f64) -> StepEngine {
    let optimizer = Optimizer::new(
        OptimizerConfig::AdamW(AdamWConfig {
            lr,
            weight_decay: 0.0,
            ..AdamWConfig::default()
        }),
        model.trainable_parameters(),
    )
    .unwrap();
    let settings = StepSettings {
        schedule: LrSchedule::Constant { warmup_steps: 0 },
        clip_norm: Some(1.0),
        spike: StepSettings::spike_off(),
        max_bad_steps: 3,
    };
    settings.validate().unwrap();
    StepEngine::new(optimizer, settings)
}

fn settings(sync: Option<stoke_train::preference::train::ReferenceSync>) -> PairLoopSettings {
    PairLoopSettings {
        pairs_per_micro_batch: 2,
        micro_batches: 2,
        layout: ScoringLayout::SharedPrefix,
        seed: 7,
        sync,
        shards: 1,
    }
}

#[test]
fn dpo_learns_to_prefer_the_chosen_responses() {
    let pairs = read_fixture_pairs(8);
    for loss_type in [DpoLossType::Sigmoid, DpoLossType::ApoZero] {
        let policy = model();
        let all: Vec<_> = pairs.iter().collect();
        let cached = score_reference(&policy, &all, ScoringLayout::SharedPrefix).unwrap();
        let objective = PairObjective::Dpo(DpoLoss {
            beta: 0.5,
            loss_type: vec![loss_type],
            ..DpoLoss::default()
        });
        let mut trainer = PairTrainer::new(
            policy.clone(),
            engine(&policy, 3e-3),
            objective,
            Reference::Cached(cached),
            pairs.clone(),
            settings(None),
        )
        .unwrap();
        let first = trainer.step().unwrap();
        // Step 1 starts at the reference: every reward is 0.
        assert_eq!(first.metric("rewards/margins"), Some(0.0));
        assert_eq!(first.outcome, StepOutcome::Applied);
        let mut last = first.clone();
        for _ in 0..24 {
            last = trainer.step().unwrap();
        }
        assert!(last.epoch >= 2, "the loop cycles through epochs");
        let margin = last.metric("rewards/margins").unwrap();
        assert!(
            margin > 0.5,
            "{loss_type:?}: margin {margin} after 25 steps"
        );
        assert_eq!(
            last.metric("rewards/accuracies"),
            Some(1.0),
            "{loss_type:?}"
        );
        assert!(
            last.loss < first.loss,
            "{loss_type:?}: {} -> {}",
            first.loss,
            last.loss
        );
        if loss_type == DpoLossType::ApoZero {
            // APO-zero pushes the chosen log-probs up, not only the margin.
            assert!(last.metric("rewards/chosen").unwrap() > 0.0);
        }
    }
}

#[test]
fn reference_free_losses_and_the_live_reference_with_tr_dpo_sync_train() {
    let pairs = read_fixture_pairs(4);
    for objective in [
        PairObjective::Cpo(CpoLoss::simpo(2.0, 0.5)),
        PairObjective::Orpo(OrpoLoss::default()),
    ] {
        let policy = model();
        let mut trainer = PairTrainer::new(
            policy.clone(),
            engine(&policy, 3e-3),
            objective.clone(),
            Reference::None,
            pairs.clone(),
            settings(None),
        )
        .unwrap();
        let first = trainer.step().unwrap();
        let mut last = first.clone();
        for _ in 0..10 {
            last = trainer.step().unwrap();
        }
        assert!(
            last.loss < first.loss,
            "{}: {} -> {}",
            objective.name(),
            first.loss,
            last.loss
        );
    }
    // DPO needs its reference: refused without one.
    let policy = model();
    let refused = PairTrainer::new(
        policy.clone(),
        engine(&policy, 1e-3),
        PairObjective::Dpo(DpoLoss::default()),
        Reference::None,
        pairs.clone(),
        settings(None),
    );
    assert!(refused.is_err());

    // TR-DPO: after every 2nd step the live reference moves towards the policy.
    let reference = model();
    let sync = stoke_train::preference::train::ReferenceSync {
        alpha: 0.6,
        every: 2,
    };
    let mut trainer = PairTrainer::new(
        policy.clone(),
        engine(&policy, 3e-3),
        PairObjective::Dpo(DpoLoss::default()),
        Reference::Live(Box::new(reference)),
        pairs,
        settings(Some(sync)),
    )
    .unwrap();
    let start = first_weight(trainer.reference_model().unwrap());
    trainer.step().unwrap();
    assert_eq!(
        first_weight(trainer.reference_model().unwrap()),
        start,
        "synced too early"
    );
    trainer.step().unwrap();
    let policy_now = first_weight(trainer.model());
    let synced = first_weight(trainer.reference_model().unwrap());
    for ((s, p), r) in synced.iter().zip(&policy_now).zip(&start) {
        let want = 0.6 * f64::from(*p) + 0.4 * f64::from(*r);
        assert!((f64::from(*s) - want).abs() < 1e-6, "{s} vs {want}");
    }
    assert_ne!(synced, start);
}

fn first_weight(model: &Transformer) -> Vec<f32> {
    let (_, var) = &model.parameters()[0];
    var.as_tensor()
        .flatten_all()
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn mixing_is_alpha_policy_plus_the_rest_reference() {
    let policy = model();
    let reference = model();
    let (_, var) = &policy.parameters()[0];
    var.set(&Tensor::ones_like(var.as_tensor()).unwrap())
        .unwrap();
    let (_, rvar) = &reference.parameters()[0];
    rvar.set(&Tensor::zeros_like(rvar.as_tensor()).unwrap())
        .unwrap();
    mix_into(&reference, &policy, 0.25).unwrap();
    assert!(first_weight(&reference).iter().all(|&v| v == 0.25));
}

#[test]
fn a_dpo_run_from_toml_logs_trl_metrics_saves_the_model_and_reuses_its_reference_cache() {
    use stoke_train::preference::run::{PreferenceFile, run_preference};
    let dir = tempfile::tempdir().unwrap();
    let mut lines = pair_lines(6);
    lines.push("{broken".into());
    write(dir.path(), "pairs.jsonl", &lines);
    let config = format!(
        r#"
output_dir = "run"
[model]
pretrained = "{}"
[data]
train = "pairs.jsonl"
max_len = 120
pairs_per_micro_batch = 2
micro_batches = 2
[objective]
kind = "dpo"
[dpo]
beta = 0.5
loss_type = "apo_zero"
[optimizer]
lr = 3e-3
[training]
steps = 6
"#,
        fixture().display()
    );
    let path = dir.path().join("dpo.toml");
    std::fs::write(&path, config).unwrap();
    let file = PreferenceFile::load(&path, &[]).unwrap();
    let summary = run_preference(&file, true).unwrap();
    assert_eq!(summary.steps, 6);
    assert_eq!(summary.pairs, 6);
    assert_eq!(summary.read.skipped.len(), 1);
    assert!(
        summary.reference.ends_with("(written)"),
        "{}",
        summary.reference
    );
    let log = std::fs::read_to_string(&summary.metrics_path).unwrap();
    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 6);
    for key in [
        "loss",
        "grad_norm",
        "lr",
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
        "tokens_per_s",
    ] {
        assert!(records[5][key].is_number(), "{key} missing: {}", records[5]);
    }
    assert_eq!(records[0]["rewards/margins"], 0.0);
    assert!(records[5]["rewards/chosen"].as_f64().unwrap() > 0.0);
    let saved = Transformer::load(&summary.model_dir, &Device::Cpu).unwrap();
    assert_ne!(
        first_weight(&saved),
        first_weight(&model()),
        "the saved model trained"
    );
    assert!(summary.model_dir.join("tokenizer.json").exists());

    // A second run on the same pairs and weights reads the cache (a run of its own: the first
    // run's folder holds its checkpoint, and a fresh start there is refused).
    let mut second = file.clone();
    second.output_dir = dir.path().join("run-2");
    second.reference.cache_dir = Some(file.output_dir.join("reference"));
    let again = run_preference(&second, true).unwrap();
    assert!(again.reference.ends_with("(reused)"), "{}", again.reference);

    // Keys are checked by path.
    let err = PreferenceFile::load(&path, &["dpo.betta=0.1".to_string()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("dpo") && err.contains("betta"), "{err}");
    // Shards: "auto" (the default) or a count of at least one, named when wrong.
    use stoke_train::preference::run::BatchShards;
    assert_eq!(file.training.batch_shards, BatchShards::Auto);
    let set = |value: &str| {
        PreferenceFile::load(&path, &[format!("training.batch_shards={value}")])
            .map(|f| f.training.batch_shards)
            .map_err(|e| e.to_string())
    };
    assert_eq!(set("3"), Ok(BatchShards::Count(3)));
    assert_eq!(set("\"auto\""), Ok(BatchShards::Auto));
    for bad in ["0", "\"fast\""] {
        let err = set(bad).unwrap_err();
        assert!(err.contains("batch_shards"), "{bad}: {err}");
    }
    assert!(summary.shards >= 1);
    let mut bad = file.clone();
    bad.data.max_len = Some(4096);
    let err = run_preference(&bad, true).unwrap_err().to_string();
    assert!(err.contains("data.max_len"), "{err}");
}

#[test]
fn kto_learns_from_unpaired_labels_with_the_mismatched_reference_point() {
    use stoke_train::preference::KtoLoss;
    use stoke_train::preference::data::read_labelled;
    use stoke_train::preference::train::kto_rows;
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (0..8)
        .map(|k| {
            let (a, b) = (k % 5, (k / 5) % 4);
            let good = k % 2 == 0;
            let answer = if good { a + b } else { a + b + 3 };
            json!({"prompt": format!("add {a} {b}"), "completion": format!("sum {answer}"),
                   "label": good})
            .to_string()
        })
        .collect();
    let path = write(dir.path(), "kto.jsonl", &lines);
    let (examples, _) = read_labelled(&path, &tokenizer(), OPTIONS).unwrap();
    let rows = kto_rows(&examples);
    // Example i's mismatched completion is example i + 1's, cyclically.
    assert_eq!(rows[7].rejected_ids, examples[0].completion_ids);
    assert_eq!(rows[2].prompt_ids, examples[2].prompt_ids);
    let policy = model();
    let all: Vec<_> = rows.iter().collect();
    let cached = score_reference(&policy, &all, ScoringLayout::SharedPrefix).unwrap();
    let mut trainer = PairTrainer::kto(
        policy.clone(),
        engine(&policy, 3e-3),
        KtoLoss {
            beta: 0.5,
            ..KtoLoss::default()
        },
        Reference::Cached(cached),
        &examples,
        settings(None),
    )
    .unwrap();
    let first = trainer.step().unwrap();
    assert_eq!(
        first.metric("kl"),
        Some(0.0),
        "the policy starts at the reference"
    );
    let mut last = first.clone();
    for _ in 0..20 {
        last = trainer.step().unwrap();
    }
    let margin = last.metric("rewards/margins").unwrap();
    assert!(margin > 0.2, "margin {margin}");
    assert!(last.loss < first.loss, "{} -> {}", first.loss, last.loss);
    // KTO through the pair constructor is refused with a pointer to the right one.
    let err = PairTrainer::new(
        policy.clone(),
        engine(&policy, 1e-3),
        PairObjective::Kto(KtoLoss::default()),
        Reference::None,
        rows,
        settings(None),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("PairTrainer::kto"), "{err}");
}

/// The parameters' gradients in `stores`, summed store by store.
fn summed_grads(model: &Transformer, stores: &[candle_core::backprop::GradStore]) -> Vec<Vec<f64>> {
    model
        .parameters()
        .iter()
        .map(|(_, v)| {
            let mut sum = vec![0f64; v.as_tensor().elem_count()];
            for store in stores {
                if let Some(g) = store.get(v.as_tensor()) {
                    let g = g.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    for (s, x) in sum.iter_mut().zip(g) {
                        *s += f64::from(x);
                    }
                }
            }
            sum
        })
        .collect()
}

#[test]
fn sharded_micro_batches_give_the_unsharded_loss_and_gradients() {
    use stoke_train::preference::KtoLoss;
    use stoke_train::preference::shards::ShardedLogps;
    let model = model();
    let pairs = read_fixture_pairs(5);
    let batch: Vec<_> = pairs.iter().collect();
    let layout = ScoringLayout::SharedPrefix;
    let reference = reference_logps(
        &batch,
        &score_reference(&model, &batch, layout).unwrap(),
        &Device::Cpu,
    )
    .unwrap();
    let labels = [true, false, true, true, false];
    // Per-pair losses, one that couples the batch (AOT sorts the margins over it), and KTO,
    // whose KL point reads the batch's mismatched rows.
    let objectives = [
        PairObjective::Dpo(DpoLoss::default()),
        PairObjective::Dpo(DpoLoss {
            loss_type: vec![DpoLossType::Aot],
            ..DpoLoss::default()
        }),
        PairObjective::Kto(KtoLoss::default()),
    ];
    for objective in &objectives {
        let labels = matches!(objective, PairObjective::Kto(_)).then_some(&labels[..]);
        let policy = pair_logps(&model, &batch, layout).unwrap();
        let whole = objective.loss(&policy, Some(&reference), labels).unwrap();
        let whole_value = whole.loss.to_scalar::<f64>().unwrap();
        let want = summed_grads(&model, &[whole.loss.backward().unwrap()]);
        for shards in [2, 3, 4, 5, 9] {
            let sharded = ShardedLogps::score(&model, &batch, layout, shards).unwrap();
            let policy = sharded.policy();
            assert_eq!(
                policy.tokens,
                pair_logps(&model, &batch, layout).unwrap().tokens
            );
            let out = objective.loss(&policy, Some(&reference), labels).unwrap();
            let value = out.loss.to_scalar::<f64>().unwrap();
            // Each pair is scored as it would be alone, so the loss is the same bit for bit.
            assert_eq!(
                value.to_bits(),
                whole_value.to_bits(),
                "{}: {value} vs {whole_value} in {shards} shards",
                objective.name()
            );
            let stores = sharded.backward(&out.loss.backward().unwrap()).unwrap();
            assert_eq!(stores.len(), shards.min(batch.len()));
            let got = summed_grads(&model, &stores);
            let (mut diff, mut scale) = (0f64, 0f64);
            for (a, b) in want.iter().flatten().zip(got.iter().flatten()) {
                diff = diff.max((a - b).abs());
                scale = scale.max(a.abs());
            }
            assert!(scale > 0.0, "no gradient reached the parameters");
            assert!(
                diff <= 1e-5 * scale,
                "{}, {shards} shards: gradients differ by {diff} (largest {scale})",
                objective.name()
            );
        }
    }
}

#[test]
fn a_sharded_loop_trains_as_the_unsharded_one() {
    let pairs = read_fixture_pairs(8);
    let mut losses = Vec::new();
    for shards in [1, 2] {
        let policy = model();
        let all: Vec<_> = pairs.iter().collect();
        let cached = score_reference(&policy, &all, ScoringLayout::SharedPrefix).unwrap();
        let mut trainer = PairTrainer::new(
            policy.clone(),
            engine(&policy, 3e-3),
            PairObjective::Dpo(DpoLoss::default()),
            Reference::Cached(cached),
            pairs.clone(),
            PairLoopSettings {
                shards,
                ..settings(None)
            },
        )
        .unwrap();
        let run: Vec<(f64, f64)> = (0..4)
            .map(|_| {
                let report = trainer.step().unwrap();
                (report.loss, report.metric("rewards/margins").unwrap())
            })
            .collect();
        losses.push(run);
    }
    assert_eq!(losses[0][0].0.to_bits(), losses[1][0].0.to_bits());
    for (a, b) in losses[0].iter().zip(&losses[1]) {
        assert!((a.0 - b.0).abs() <= 1e-5 * a.0.abs(), "{losses:?}");
        assert!(
            (a.1 - b.1).abs() <= 1e-4 * a.1.abs().max(1e-2),
            "{losses:?}"
        );
    }
    assert!(losses[1][3].1 > 0.0, "the sharded loop learns: {losses:?}");
}
