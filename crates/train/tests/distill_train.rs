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
use stoke_train::objective::{DistillObjective, NextTokenObjective, Objective};
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
            teacher: teacher.clone().into_frozen(),
            beta,
            temperature: 1.0,
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
            teacher: teacher.clone().into_frozen(),
            beta,
            temperature: 1.0,
        };
        let after = divergence(&objective, trainer.model(), held_out);
        assert!(
            after < 0.65 * before,
            "beta {beta}: divergence on a training batch {before:.5} -> {after:.5} (train {:.5} -> {:.5})",
            losses[0],
            losses[79]
        );
        // The teacher is only read.
        assert_eq!(parameter_values(&objective.teacher), teacher_weights);
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
        teacher: teacher_dir.clone(),
        beta: 0.5,
        temperature: 1.0,
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
