//! Gradient accumulation equals the large batch: the loss of a step is normalised by the total
//! loss tokens of all its micro-batches, so 1 x 4 rows, 4 x 1 row and 2 x 2 rows train the same
//! weights (within float tolerance) from the same data.

mod common;

use common::{Rng, VecSource, nano_model, parameter_values, random_batch, row_of, test_config};
use stoke_optim::Optimizer;
use stoke_train::objective::NextTokenObjective;
use stoke_train::trainer::{StepOutcome, Trainer};

const STEPS: usize = 3;
const SEQ: usize = 24;

/// Named weights, and each step's (loss, grad norm).
type Trained = (Vec<(String, Vec<f32>)>, Vec<(f64, f64)>);

/// Runs STEPS steps on `steps_of_rows` (4 rows per step), split into micro-batches of `micro`
/// rows; returns the weights and each step's (loss, grad norm).
fn train(micro: usize, batches: &[stoke_data::packing::PackedBatch]) -> Trained {
    let dir = tempfile::tempdir().unwrap();
    let accum = 4 / micro;
    let config = test_config(
        dir.path(),
        &format!("seq_len = {SEQ}\nmicro_batch_size = {micro}\ngrad_accum_steps = {accum}"),
        &format!("steps = {STEPS}"),
    );
    let mut micro_batches = Vec::new();
    for batch in batches {
        for start in (0..4).step_by(micro) {
            let rows: Vec<_> = (start..start + micro).map(|r| row_of(batch, r)).collect();
            micro_batches.push(concat(&rows));
        }
    }
    let model = nano_model(1);
    let optimizer = Optimizer::new(config.optimizer.clone(), model.parameters()).unwrap();
    let mut trainer = Trainer::new(
        config,
        model,
        optimizer,
        Box::new(NextTokenObjective::plain()),
        Box::new(VecSource::new(micro_batches)),
    );
    let mut figures = Vec::new();
    for _ in 0..STEPS {
        let report = trainer
            .train_step()
            .unwrap()
            .expect("a full step of batches");
        assert_eq!(report.outcome, StepOutcome::Applied);
        figures.push((report.loss, report.grad_norm));
    }
    (parameter_values(trainer.model()), figures)
}

fn concat(rows: &[stoke_data::packing::PackedBatch]) -> stoke_data::packing::PackedBatch {
    let mut out = rows[0].clone();
    for r in &rows[1..] {
        out.batch_size += 1;
        out.tokens.extend(&r.tokens);
        out.targets.extend(&r.targets);
        out.position_ids.extend(&r.position_ids);
        out.doc_ids.extend(&r.doc_ids);
        out.loss_mask.extend(&r.loss_mask);
        out.rows.extend(r.rows.iter().cloned());
    }
    out
}

#[test]
fn micro_batches_accumulate_to_the_large_batch() {
    let mut rng = Rng(42);
    let batches: Vec<_> = (0..STEPS).map(|_| random_batch(&mut rng, 4, SEQ)).collect();
    // The rows must differ in loss tokens, or a mean of per-micro-batch means would also pass.
    let counts: Vec<usize> = (0..4)
        .map(|r| row_of(&batches[0], r).num_loss_tokens())
        .collect();
    assert!(counts.iter().any(|&c| c != counts[0]), "{counts:?}");

    let (large, large_figures) = train(4, &batches);
    for micro in [1, 2] {
        let (accumulated, figures) = train(micro, &batches);
        for ((l, g), (l2, g2)) in large_figures.iter().zip(&figures) {
            assert!(
                (l - l2).abs() < 1e-5 * l.abs(),
                "micro {micro}: loss {l} vs {l2}"
            );
            assert!(
                (g - g2).abs() < 1e-4 * g.abs(),
                "micro {micro}: grad norm {g} vs {g2}"
            );
        }
        let mut worst = 0.0f32;
        for ((name, a), (_, b)) in large.iter().zip(&accumulated) {
            for (x, y) in a.iter().zip(b) {
                let diff = (x - y).abs();
                worst = worst.max(diff);
                assert!(diff < 2e-5, "micro {micro}: {name} differs by {diff}");
            }
        }
        eprintln!(
            "micro {micro} x accum {}: largest weight difference {worst:e}",
            4 / micro
        );
    }
}
