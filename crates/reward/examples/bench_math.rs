//! Throughput of the math verifier on a realistic mix, one thread (calls per second per core).
//!
//! `cargo run --release -p stoke-reward --example bench_math [-- SECONDS]`
//!
//! The mix: completions of about 1.5 kB of reasoning ending in a final answer (boxed, `####`,
//! "the answer is", or a trailing number), answers that are integers, decimals, fractions,
//! radicals, expressions in x, tuples and intervals, half of them wrong.

use std::hint::black_box;
use std::time::{Duration, Instant};

use stoke_reward::math::{MathConfig, MathVerifier};
use stoke_reward::{Outcome, Reference, RewardInput, Verifier};

const PAIRS: &[(&str, &str)] = &[
    ("42", "\\boxed{42}"),
    ("42", "\\boxed{41}"),
    ("1,250", "#### 1250"),
    ("\\frac{3}{4}", "The answer is $\\frac{3}{4}$."),
    ("\\frac{3}{4}", "\\boxed{0.75}"),
    ("\\frac{3}{4}", "\\boxed{\\dfrac{4}{3}}"),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
    ("\\frac{\\pi}{4}", "\\boxed{\\frac{\\pi}{3}}"),
    ("2x+2", "\\boxed{2(x+1)}"),
    ("x^2-1", "\\boxed{(x-1)(x+1)}"),
    ("(1,2)", "\\boxed{(1, 2)}"),
    ("[0, \\infty)", "\\boxed{x \\ge 0}"),
    ("18", "So she has 18 apples left"),
    ("3.5", "\\boxed{3.50}"),
    ("\\$12", "\\boxed{12 \\text{ dollars}}"),
    ("\\{1,2\\}", "\\boxed{2, 1}"),
];

fn reasoning(seed: usize) -> String {
    let sentence = "We first compute the total by multiplying the quantities, then subtract the part that was used, keeping track of units. ";
    let mut text = String::new();
    for step in 0..12 {
        text.push_str(sentence);
        text.push_str(&format!(
            "Step {}: {} + {} = {}. ",
            step,
            seed + step,
            step * 3,
            seed + step * 4
        ));
    }
    text
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let verifier = MathVerifier::new(&MathConfig::default()).expect("default config");
    let samples: Vec<(Reference, String)> = PAIRS
        .iter()
        .enumerate()
        .map(|(i, (gold, ending))| {
            (
                Reference {
                    answer: Some(gold.to_string()),
                    ..Reference::default()
                },
                format!("{}{}", reasoning(i), ending),
            )
        })
        .collect();
    let bytes: usize = samples.iter().map(|(_, c)| c.len()).sum::<usize>() / samples.len();
    let correct = samples
        .iter()
        .filter(|(r, c)| verifier.score(&RewardInput::new("", c, r)).outcome == Outcome::Correct)
        .count();
    // Warm up, then time whole passes over the mix.
    for (reference, completion) in &samples {
        black_box(verifier.score(&RewardInput::new("", completion, reference)));
    }
    let budget = Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < budget {
        for (reference, completion) in &samples {
            black_box(verifier.score(&RewardInput::new("", black_box(completion), reference)));
            calls += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "math verifier: {calls} calls in {elapsed:.2} s = {:.0} calls/s on one core ({:.1} us/call); mix of {} samples, mean completion {bytes} bytes, {correct} correct",
        calls as f64 / elapsed,
        elapsed * 1e6 / calls as f64,
        samples.len()
    );
}
