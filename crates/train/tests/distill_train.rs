//! Logit distillation through the trainer (`[distill]`): a student trained on the generalized JSD
//! to a teacher (trained first on a patterned sequence, so its distributions are peaked) moves its
//! next-token distributions to the teacher's for each beta (the divergence on a batch it trained
//! on falls below 0.65 of its start), the teacher's weights never change, and a run refuses a
//! teacher over another vocabulary, naming the field.

mod common;

use common::{Rng, VecSource, batch_from_docs, nano_model, parameter_values, test_config};
use stoke_data::packing::PackedBatch;
use stoke_model::Transformer;
use stoke_optim::Optimizer;
use stoke_train::objective::{
    DistillObjective, NextTokenObjective, Objective, OnPolicySampling, Teacher,
};
use stoke_train::trainer::{StepOutcome, Trainer};

const SEQ: usize = 24;

/// Rows of documents that follow `next = (7 x + 3) mod 300` from a random start: a teacher
/// trained on them has peaked next-token distributions.
fn pattern_batch(rng: &mut Rng, rows: usize) -> PackedBatch {
    let docs: Vec<Vec<Vec<u32>>> = (0..rows)
        .map(|_| {
            let mut x = rng.below(300) as u32;
            vec![
                (0..20)
                    .map(|_| {
                        let t = x;
                        x = (7 * x + 3) % 300;
                        t
                    })
                    .collect(),
            ]
        })
        .collect();
    batch_from_docs(&docs, SEQ)
}

fn trained_teacher(batches: &[PackedBatch]) -> Transformer {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(
        dir.path(),
        &format!("seq_len = {SEQ}\nmicro_batch_size = 4\ngrad_accum_steps = 1"),
        &format!("steps = {}", batches.len()),
    );
    let model = nano_model(11);
    let optimizer = Optimizer::new(config.optimizer.clone(), model.parameters()).unwrap();
    let mut trainer = Trainer::new(
        config,
        model,
        optimizer,
        Box::new(NextTokenObjective::plain()),
        Box::new(VecSource::new(batches.to_vec())),
    );
    while trainer.train_step().unwrap().is_some() {}
    trainer.into_model()
}

fn divergence(objective: &DistillObjective, student: &Transformer, batch: &PackedBatch) -> f64 {
    let out = objective.loss(student, batch).unwrap();
    out.nll_sum / out.loss_tokens as f64
}

#[test]
fn a_student_distilled_from_a_teacher_approaches_its_distributions() {
    let mut rng = Rng(7);
    let teacher_data: Vec<_> = (0..200).map(|_| pattern_batch(&mut rng, 4)).collect();
    // 20 distinct batches, seen 4 times each.
    let distinct: Vec<_> = (0..20).map(|_| pattern_batch(&mut rng, 2)).collect();
    let batches: Vec<_> = (0..80).map(|i| distinct[i % 20].clone()).collect();
    let held_out = &distinct[0];
    let teacher = trained_teacher(&teacher_data);
    let teacher_weights = parameter_values(&teacher);
    for beta in [0.0, 0.5, 1.0] {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(
            dir.path(),
            &format!("seq_len = {SEQ}\nmicro_batch_size = 2\ngrad_accum_steps = 1"),
            "steps = 80",
        );
        let objective = DistillObjective {
            teacher: Teacher::model(teacher.clone().into_frozen()),
            beta,
            temperature: 1.0,
            on_policy: None,
            ce_weight: 0.0,
        };
        let student = nano_model(3);
        let before = divergence(&objective, &student, held_out);
        let optimizer = Optimizer::new(config.optimizer.clone(), student.parameters()).unwrap();
        let mut trainer = Trainer::new(
            config,
            student,
            optimizer,
            Box::new(objective),
            Box::new(VecSource::new(batches.clone())),
        );
        let mut losses = Vec::new();
        for _ in 0..80 {
            let report = trainer.train_step().unwrap().expect("a step");
            assert_eq!(report.outcome, StepOutcome::Applied);
            losses.push(report.loss);
        }
        assert!(
            losses.iter().all(|l| l.is_finite() && *l >= 0.0),
            "{losses:?}"
        );
        let objective = DistillObjective {
            teacher: Teacher::model(teacher.clone().into_frozen()),
            beta,
            temperature: 1.0,
            on_policy: None,
            ce_weight: 0.0,
        };
        let after = divergence(&objective, trainer.model(), held_out);
        assert!(
            after < 0.65 * before,
            "beta {beta}: divergence on a training batch {before:.5} -> {after:.5} (train {:.5} -> {:.5})",
            losses[0],
            losses[79]
        );
        // The teacher is only read.
        let Teacher::Model { model, .. } = &objective.teacher else {
            unreachable!("a model teacher")
        };
        assert_eq!(parameter_values(model), teacher_weights);
    }
}

#[test]
fn a_teacher_over_another_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let teacher_dir = dir.path().join("teacher");
    let json = stoke_train::config::ModelPreset::Nano.config_json(common::VOCAB + 8, 64);
    let config =
        stoke_model::ModelConfig::from_json_str(&json.to_string(), std::path::Path::new("<nano>"))
            .unwrap();
    Transformer::init(config, &candle_core::Device::Cpu, 1)
        .unwrap()
        .save(&teacher_dir)
        .unwrap();
    let mut config = test_config(
        &dir.path().join("run"),
        &format!("seq_len = {SEQ}\nmicro_batch_size = 2"),
        "steps = 1",
    );
    config.distill = Some(stoke_train::config::DistillConfig {
        teacher: Some(teacher_dir.clone()),
        top_k: None,
        beta: 0.5,
        temperature: 1.0,
        lmbda: 0.0,
        max_new_tokens: 128,
        generation_temperature: 0.9,
        ce_weight: 0.0,
    });
    let options = stoke_train::run::RunOptions {
        quiet: true,
        ..Default::default()
    };
    let error = stoke_train::run::run(config, options)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("distill.teacher") && error.contains(&teacher_dir.display().to_string()),
        "{error}"
    );
    assert!(error.contains("308") && error.contains("300"), "{error}");
}

/// `batch` with the first `prompt` positions of every piece untrained: a chat-like batch whose
/// replies start after `prompt` tokens.
fn with_prompts(mut batch: PackedBatch, prompt: usize) -> PackedBatch {
    for r in 0..batch.batch_size {
        for p in 0..batch.rows[r].pieces.len() {
            let positions: Vec<usize> = (r * batch.seq_len..(r + 1) * batch.seq_len)
                .filter(|&i| batch.doc_ids[i] == p as u32)
                .collect();
            for &i in positions.iter().take(prompt - 1) {
                batch.loss_mask[i] = false;
            }
        }
    }
    batch
}

fn on_policy(lmbda: f64) -> OnPolicySampling {
    OnPolicySampling {
        lmbda,
        max_new_tokens: 6,
        temperature: 1.0,
        seed: 3,
        stop_token_ids: vec![299],
    }
}

#[test]
fn prompts_are_each_conversation_up_to_its_first_trained_token() {
    let docs = vec![
        vec![vec![1, 2, 3, 4, 5], vec![6, 7, 8]],
        vec![vec![9, 10, 11, 12]],
    ];
    let batch = with_prompts(batch_from_docs(&docs, 10), 2);
    assert_eq!(
        OnPolicySampling::prompts(&batch),
        vec![vec![1, 2], vec![6, 7], vec![9, 10]]
    );
    // A piece trained from its first position (cut inside a reply) has no prompt.
    let batch = batch_from_docs(&docs, 10);
    assert!(OnPolicySampling::prompts(&batch).is_empty());
}

/// lmbda 1: the micro-batch is replaced by the student's own samples of its prompts (the same
/// samples for the same seed), the loss is on exactly the sampled tokens, and the divergence the
/// objective returns is their mean weighted by the data batch's token count.
#[test]
fn on_policy_batches_train_on_the_students_own_samples() {
    let mut rng = Rng(5);
    let batch = with_prompts(pattern_batch(&mut rng, 3), 4);
    let student = nano_model(2);
    let sampling = on_policy(1.0);
    let seed = sampling.takes(&batch).expect("lmbda 1 takes every batch");
    let own = sampling
        .student_batch(&student, &batch, seed)
        .unwrap()
        .expect("the batch has prompts");
    let again = sampling
        .student_batch(&student, &batch, seed)
        .unwrap()
        .unwrap();
    assert_eq!(own, again, "the same seed samples the same replies");
    let prompts = OnPolicySampling::prompts(&batch);
    assert_eq!(own.batch_size, prompts.len());
    for (r, prompt) in prompts.iter().enumerate() {
        let row = &own.tokens[r * own.seq_len..(r + 1) * own.seq_len];
        let used = own.rows[r].pieces[0].len as usize;
        assert_eq!(&row[..prompt.len()], prompt.as_slice());
        let sampled = used - prompt.len();
        assert!((1..=6).contains(&sampled), "{sampled} sampled tokens");
        let mask = &own.loss_mask[r * own.seq_len..(r + 1) * own.seq_len];
        let trained: Vec<usize> = (0..own.seq_len).filter(|&t| mask[t]).collect();
        let want: Vec<usize> = (prompt.len() - 1..used - 1).collect();
        assert_eq!(trained, want, "the loss is on the sampled tokens only");
        if sampled < 6 {
            assert_eq!(row[used - 1], 299, "a short reply ended on the stop id");
        }
    }

    let teacher = nano_model(9).into_frozen();
    let plain = DistillObjective {
        teacher: Teacher::model(teacher.clone()),
        beta: 0.5,
        temperature: 1.0,
        on_policy: None,
        ce_weight: 0.0,
    };
    let on = DistillObjective {
        teacher: Teacher::model(teacher),
        beta: 0.5,
        temperature: 1.0,
        on_policy: Some(sampling),
        ce_weight: 0.0,
    };
    let out = on.loss(&student, &batch).unwrap();
    let reference = plain.loss(&student, &own).unwrap();
    assert_eq!(out.loss_tokens, batch.num_loss_tokens());
    let mean = reference.nll_sum / reference.loss_tokens as f64;
    assert!(
        (out.nll_sum / out.loss_tokens as f64 - mean).abs() < 1e-6 * mean.abs().max(1.0),
        "{} vs {mean}",
        out.nll_sum / out.loss_tokens as f64
    );
    // The data batch's own divergence is another number.
    let data = plain.loss(&student, &batch).unwrap();
    assert!((data.nll_sum / data.loss_tokens as f64 - mean).abs() > 1e-6);
    // `ce_weight` leaves an on-policy batch alone: its tokens are the student's samples, not
    // labels.
    let with_ce = DistillObjective {
        teacher: Teacher::model(nano_model(9).into_frozen()),
        beta: 0.5,
        temperature: 1.0,
        on_policy: Some(on_policy(1.0)),
        ce_weight: 3.0,
    };
    assert_eq!(with_ce.loss(&student, &batch).unwrap().nll_sum, out.nll_sum);
}

/// `ce_weight = w` adds w x the data replies' cross-entropy to the divergence, in the loss and
/// in every gradient (Hinton et al.'s soft plus hard targets).
#[test]
fn ce_weight_adds_the_cross_entropy_of_the_data_replies() {
    let mut rng = Rng(29);
    let batch = pattern_batch(&mut rng, 2);
    let student = nano_model(6);
    let teacher = nano_model(10).into_frozen();
    let objective = |ce_weight: f64| DistillObjective {
        teacher: Teacher::model(teacher.clone()),
        beta: 0.5,
        temperature: 1.0,
        on_policy: None,
        ce_weight,
    };
    let w = 0.7;
    let mixed = objective(w).loss(&student, &batch).unwrap();
    let divergence = objective(0.0).loss(&student, &batch).unwrap();
    let cross_entropy = NextTokenObjective::plain().loss(&student, &batch).unwrap();
    assert_eq!(mixed.loss_tokens, divergence.loss_tokens);
    let want = divergence.nll_sum + w * cross_entropy.nll_sum;
    assert!(
        (mixed.nll_sum - want).abs() < 1e-5 * want.abs(),
        "{} vs {want}",
        mixed.nll_sum
    );
    let grads = |out: &stoke_train::objective::ObjectiveOutput| {
        common::gradient_values(&student, &out.loss_sum.backward().unwrap())
    };
    let (gm, gd, gc) = (grads(&mixed), grads(&divergence), grads(&cross_entropy));
    let mut worst = 0f32;
    let mut scale = 0f32;
    for ((m, d), c) in gm.iter().zip(&gd).zip(&gc) {
        for ((m, d), c) in m.iter().zip(d).zip(c) {
            let want = d + w as f32 * c;
            worst = worst.max((m - want).abs());
            scale = scale.max(want.abs());
        }
    }
    assert!(
        scale > 0.0 && worst <= 1e-4 * scale,
        "gradient off by {worst} (largest {scale})"
    );
}

/// lmbda in (0, 1): about that share of batches is drawn, the same ones on every call.
#[test]
fn lmbda_draws_that_share_of_batches_deterministically() {
    let sampling = on_policy(0.3);
    let mut rng = Rng(17);
    let batches: Vec<PackedBatch> = (0..300).map(|_| pattern_batch(&mut rng, 1)).collect();
    let drawn: Vec<bool> = batches
        .iter()
        .map(|b| sampling.takes(b).is_some())
        .collect();
    let again: Vec<bool> = batches
        .iter()
        .map(|b| sampling.takes(b).is_some())
        .collect();
    assert_eq!(drawn, again);
    let share = drawn.iter().filter(|&&d| d).count() as f64 / 300.0;
    assert!((0.22..=0.38).contains(&share), "share {share}");
    assert!(batches.iter().all(|b| on_policy(0.0).takes(b).is_none()));
}

/// `top_k` equal to the vocabulary is the full divergence (the tail bucket holds ~0 mass); a
/// smaller `top_k` is another, finite number (the teacher's top entries plus the rest of mass).
#[test]
fn a_teacher_top_k_over_the_whole_vocabulary_is_the_full_divergence() {
    let mut rng = Rng(23);
    let batch = pattern_batch(&mut rng, 2);
    let student = nano_model(4);
    let teacher = nano_model(8).into_frozen();
    let objective = |top_k: Option<usize>, beta: f64| DistillObjective {
        teacher: Teacher::Model {
            model: teacher.clone(),
            top_k,
        },
        beta,
        temperature: 1.5,
        on_policy: None,
        ce_weight: 0.0,
    };
    for beta in [0.0, 0.5, 1.0] {
        let full = divergence(&objective(None, beta), &student, &batch);
        let whole = divergence(&objective(Some(common::VOCAB), beta), &student, &batch);
        assert!(
            (full - whole).abs() < 1e-4 * full.abs().max(1e-3),
            "beta {beta}: full {full} vs top-{} {whole}",
            common::VOCAB
        );
        let top4 = divergence(&objective(Some(4), beta), &student, &batch);
        assert!(
            top4.is_finite() && (top4 - full).abs() > 1e-6,
            "beta {beta}: {top4}"
        );
    }
}

/// `ce_weight` below 0 or not finite is refused, naming the key.
#[test]
fn a_negative_ce_weight_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(
        dir.path(),
        &format!("seq_len = {SEQ}\nmicro_batch_size = 2"),
        "steps = 1",
    );
    for bad in [-0.5, f64::NAN, f64::INFINITY] {
        config.distill = Some(stoke_train::config::DistillConfig {
            teacher: Some(dir.path().join("teacher")),
            top_k: None,
            beta: 0.5,
            temperature: 1.0,
            lmbda: 0.0,
            max_new_tokens: 128,
            generation_temperature: 0.9,
            ce_weight: bad,
        });
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("distill.ce_weight"), "{bad}: {error}");
    }
    config.distill.as_mut().unwrap().ce_weight = 2.0;
    config.validate().unwrap();
}
