//! Throughput of the math verifier on a realistic mix, one thread (calls per second per core).
//!
//! `cargo run --release -p stoke-reward --example bench_math [-- SECONDS]`
//!
//! Two mixes, each of completions with about 1.5 kB of reasoning before the final answer:
//! GSM8K-style (plain numbers, `####`, "the answer is", currency, markdown, a hedge) and
//! MATH-style LaTeX (boxes and math spans holding fractions, radicals, expressions in x, tuples,
//! intervals, sets, matrices, labels, trig powers, base-n), some of them wrong.

use std::hint::black_box;
use std::time::{Duration, Instant};

use stoke_reward::math::{MathConfig, MathVerifier};
use stoke_reward::{Outcome, Reference, RewardInput, Verifier};

/// GSM8K-style endings: plain numbers, `####`, "The answer is", currency, markdown.
const GSM8K_PAIRS: &[(&str, &str)] = &[
    ("18", "She sells 9 * 2 = $18 worth of eggs.\n#### 18"),
    ("18", "#### 17"),
    ("1,250", "#### 1250"),
    ("72", "Altogether she sold 48 + 24 = 72 clips."),
    ("10", "So she earned 0.2 x 50 = $10."),
    ("5", "The answer is 17 + 1 = 18."),
    ("18", "**Answer:** 18"),
    ("624", "The final answer is 624."),
    ("3.5", "Each friend gets 3.5 pizzas."),
    ("12", "She needs at least 12 boxes."),
];

/// MATH-style endings: LaTeX in boxes and math spans.
const MATH_PAIRS: &[(&str, &str)] = &[
    ("42", "\\boxed{42}"),
    ("\\frac{3}{4}", "The answer is $\\frac{3}{4}$."),
    ("\\frac{3}{4}", "\\boxed{0.75}"),
    ("\\frac{3}{4}", "\\boxed{\\dfrac{4}{3}}"),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
    ("\\frac{\\pi}{4}", "\\boxed{\\frac{\\pi}{3}}"),
    ("2x+2", "\\boxed{2(x+1)}"),
    ("x^2-1", "\\boxed{(x-1)(x+1)}"),
    ("(1,2)", "\\boxed{(1, 2)}"),
    ("[0, \\infty)", "\\boxed{x \\ge 0}"),
    ("\\$12", "\\boxed{12 \\text{ dollars}}"),
    ("\\{1,2\\}", "\\boxed{2, 1}"),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}",
    ),
    ("(p,q)=(3,2)", "Thus $(p, q) = \\boxed{(3, 2)}$."),
    ("\\tan^2 y + 1", "$\\boxed{\\sec^2 y}$"),
    ("204_5", "The quotient is $\\boxed{204_5}$."),
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

/// Calls per second of one thread over `pairs`, each ending appended to 1.5 kB of reasoning.
fn measure(verifier: &MathVerifier, pairs: &[(&str, &str)], seconds: f64) -> (f64, usize, usize) {
    let samples: Vec<(Reference, String)> = pairs
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
    (
        calls as f64 / started.elapsed().as_secs_f64(),
        bytes,
        correct,
    )
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let verifier = MathVerifier::new(&MathConfig::default()).expect("default config");
    for (name, pairs) in [
        ("GSM8K-style", GSM8K_PAIRS),
        ("MATH-style LaTeX", MATH_PAIRS),
    ] {
        let (per_second, bytes, correct) = measure(&verifier, pairs, seconds);
        println!(
            "math verifier, {name}: {per_second:.0} calls/s on one core ({:.1} us/call); {} samples, mean completion {bytes} bytes, {correct} correct",
            1e6 / per_second,
            pairs.len()
        );
    }
}
