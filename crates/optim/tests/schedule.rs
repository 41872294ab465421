//! Learning-rate schedules at their breakpoints, WSD re-planned from a stable-phase step,
//! batch-size warmup and the sqrt batch rule.

use stoke_optim::{BatchSizeWarmup, DecayShape, LrSchedule, sqrt_batch_lr};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn constant_warmup_is_linear_and_reaches_one_at_its_last_step() {
    let s = LrSchedule::Constant { warmup_steps: 4 };
    assert!(close(s.lr_factor(0), 0.25));
    assert!(close(s.lr_factor(1), 0.5));
    assert!(close(s.lr_factor(3), 1.0));
    assert!(close(s.lr_factor(4), 1.0));
    assert!(close(s.lr_factor(1_000_000), 1.0));
}

#[test]
fn no_warmup_starts_at_peak() {
    assert!(close(
        LrSchedule::Constant { warmup_steps: 0 }.lr_factor(0),
        1.0
    ));
}

#[test]
fn cosine_breakpoints() {
    let s = LrSchedule::Cosine {
        warmup_steps: 10,
        total_steps: 110,
        min_lr_ratio: 0.1,
    };
    assert!(close(s.lr_factor(0), 0.1)); // (0 + 1) / 10
    assert!(close(s.lr_factor(9), 1.0)); // warmup end
    // Halfway through the 100 decay updates (progress 50/100): midway between 1 and 0.1.
    assert!(close(s.lr_factor(59), 0.55));
    assert!(close(s.lr_factor(109), 0.1)); // last step reaches the floor
    assert!(close(s.lr_factor(500), 0.1)); // and stays there
    // Monotone during decay.
    assert!((10..109).all(|t| s.lr_factor(t) >= s.lr_factor(t + 1)));
}

fn wsd(shape: DecayShape) -> LrSchedule {
    LrSchedule::Wsd {
        warmup_steps: 5,
        decay_start: 80,
        decay_steps: 20,
        min_lr_ratio: 0.1,
        decay_shape: shape,
    }
}

#[test]
fn wsd_is_flat_between_warmup_and_decay_start() {
    let s = wsd(DecayShape::Linear);
    assert!(close(s.lr_factor(4), 1.0)); // warmup end
    assert!((4..80).all(|t| close(s.lr_factor(t), 1.0)));
    assert!(s.lr_factor(80) < 1.0); // decay_start is the first decayed update
}

#[test]
fn wsd_linear_breakpoints() {
    let s = wsd(DecayShape::Linear);
    assert!(close(s.lr_factor(80), 0.1 + 0.9 * (1.0 - 1.0 / 20.0)));
    assert!(close(s.lr_factor(89), 0.1 + 0.9 * 0.5));
    assert!(close(s.lr_factor(99), 0.1));
    assert!(close(s.lr_factor(10_000), 0.1));
}

#[test]
fn wsd_cosine_and_sqrt_shapes_at_midpoint() {
    // progress 10/20 = 0.5 at step 89
    assert!(close(
        wsd(DecayShape::Cosine).lr_factor(89),
        0.1 + 0.9 * 0.5
    ));
    let expected_sqrt = 0.1 + 0.9 * (1.0 - 0.5f64.sqrt());
    assert!(close(wsd(DecayShape::Sqrt).lr_factor(89), expected_sqrt));
    for shape in [DecayShape::Linear, DecayShape::Cosine, DecayShape::Sqrt] {
        assert!(
            close(wsd(shape).lr_factor(99), 0.1),
            "{shape:?} ends at the floor"
        );
    }
}

#[test]
fn wsd_restarted_from_stable_checkpoint_follows_new_plan() {
    // A run planned to decay at 80 saved a checkpoint at step 60 (stable phase). Resumed with
    // the decay moved to 150, it continues exactly as the original up to step 79 ...
    let planned = wsd(DecayShape::Sqrt);
    let replanned = LrSchedule::Wsd {
        warmup_steps: 5,
        decay_start: 150,
        decay_steps: 20,
        min_lr_ratio: 0.1,
        decay_shape: DecayShape::Sqrt,
    };
    assert!((0..80).all(|t| planned.lr_factor(t) == replanned.lr_factor(t)));
    // ... stays at peak until the new decay start, and decays there the same way.
    assert!((60..150).all(|t| close(replanned.lr_factor(t), 1.0)));
    assert!((0..30).all(|k| planned.lr_factor(80 + k) == replanned.lr_factor(150 + k)));
}

#[test]
fn wsd_for_decays_over_the_last_fraction() {
    let s = LrSchedule::wsd_for(1000, 10, 0.2);
    let LrSchedule::Wsd {
        decay_start,
        decay_steps,
        min_lr_ratio,
        ..
    } = s
    else {
        panic!("wsd_for returns a Wsd schedule, got {s:?}")
    };
    assert_eq!((decay_start, decay_steps), (800, 200));
    assert!(close(min_lr_ratio, 0.0));
    assert!(close(s.lr_factor(799), 1.0));
    assert!(close(s.lr_factor(999), 0.0));
}

#[test]
fn schedules_stay_in_unit_interval() {
    let schedules = [
        LrSchedule::Constant { warmup_steps: 3 },
        LrSchedule::Cosine {
            warmup_steps: 0,
            total_steps: 0,
            min_lr_ratio: 0.0,
        },
        LrSchedule::Wsd {
            warmup_steps: 0,
            decay_start: 0,
            decay_steps: 0,
            min_lr_ratio: 0.0,
            decay_shape: DecayShape::Cosine,
        },
        LrSchedule::wsd_for(7, 100, 0.5),
    ];
    for s in &schedules {
        for t in [0u64, 1, 2, 5, 99, 100, u64::MAX] {
            let f = s.lr_factor(t);
            assert!(
                f.is_finite() && (0.0..=1.0).contains(&f),
                "{s:?} at {t}: {f}"
            );
        }
    }
}

#[test]
fn validate_rejects_warmup_past_decay_start() {
    let s = LrSchedule::Wsd {
        warmup_steps: 100,
        decay_start: 50,
        decay_steps: 10,
        min_lr_ratio: 0.0,
        decay_shape: DecayShape::Linear,
    };
    let err = s
        .validate()
        .expect_err("warmup after decay start is invalid");
    assert!(err.to_string().contains("schedule.warmup_steps"), "{err}");
}

#[test]
fn schedule_file_format_rejects_unknown_keys() {
    let ok: LrSchedule = toml::from_str(
        "kind = \"wsd\"\nwarmup_steps = 1\ndecay_start = 5\ndecay_steps = 2\nmin_lr_ratio = 0.0\ndecay_shape = \"sqrt\"\n",
    )
    .expect("valid wsd table");
    assert!(matches!(
        ok,
        LrSchedule::Wsd {
            decay_shape: DecayShape::Sqrt,
            ..
        }
    ));
    let bad = toml::from_str::<LrSchedule>("kind = \"constant\"\nwarmup_steps = 1\nwarmup = 2\n");
    assert!(bad.is_err());
}

#[test]
fn batch_size_warmup_ramps_linearly_then_holds() {
    let w = BatchSizeWarmup {
        start_tokens_per_step: 1024,
        end_tokens_per_step: 8192,
        ramp_tokens: 1_000_000,
    };
    assert_eq!(w.tokens_per_step(0), 1024);
    assert_eq!(w.tokens_per_step(500_000), 1024 + (8192 - 1024) / 2);
    assert_eq!(w.tokens_per_step(1_000_000), 8192);
    assert_eq!(w.tokens_per_step(u64::MAX), 8192);
    let mut previous = 0;
    for seen in (0..1_000_000).step_by(10_007) {
        let now = w.tokens_per_step(seen);
        assert!(now >= previous);
        previous = now;
    }
}

#[test]
fn batch_size_warmup_without_ramp_is_end_value() {
    let w = BatchSizeWarmup {
        start_tokens_per_step: 1,
        end_tokens_per_step: 77,
        ramp_tokens: 0,
    };
    assert_eq!(w.tokens_per_step(0), 77);
}

#[test]
fn sqrt_batch_rule() {
    assert!(close(sqrt_batch_lr(1e-3, 256, 1024), 2e-3));
    assert!(close(sqrt_batch_lr(1e-3, 256, 64), 5e-4));
    assert!(close(sqrt_batch_lr(1e-3, 256, 256), 1e-3));
    assert!(close(sqrt_batch_lr(1e-3, 0, 64), 1e-3));
}
