//! The built-in verifiable task: procedurally generated arithmetic word problems with worked
//! solutions and exact integer answers.
//!
//! What it is: a deterministic generator. [`ArithmeticTask::problems`] draws problems from a seed
//! (ChaCha8, so the same seed gives the same problems on every machine), as many as asked, at the
//! [`Level`]s configured. Each [`Problem`] carries its question (a short story naming a person and
//! objects), its worked solution (one equation per step, e.g. `Mia has 7 + 5 = 12 shells.`), the
//! answer and the steps as typed records.
//!
//! Train / held-out split: a question belongs to exactly one [`Split`], decided by a hash of its
//! text, so a held-out question can never be drawn for training, whatever the seeds and counts.
//! Held-out problems are also distinct from each other (an evaluation set without duplicates).
//! No question template is a substring of another, so no held-out question appears inside a
//! training document either (tested in `tests/arithmetic.rs`).
//!
//! What it is not: a file writer (`corpus.rs` renders problems as pretraining documents and chat
//! records) or a scorer (`accuracy.rs`).
//!
//! Invariants: every answer is a non-negative integer; every intermediate result is exact
//! (divisions divide evenly); counts of objects stated in the text are at least 2, so nouns stay
//! plural.

use std::collections::HashSet;

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The line that ends every chat-format solution: `#### <answer>` (the GSM8K convention, read by
/// the reward crate's `gsm8k` exact-match mode).
pub const FINAL_ANSWER_PREFIX: &str = "####";

/// How hard a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// One addition or subtraction of numbers from 2 to 9.
    SingleDigit,
    /// One operation (+, -, *, /) on numbers up to 50 (products and quotients up to 10 x 10).
    OneStep,
    /// Two chained operations on numbers up to 20.
    TwoStep,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::SingleDigit, Level::OneStep, Level::TwoStep];

    pub fn name(self) -> &'static str {
        match self {
            Level::SingleDigit => "single_digit",
            Level::OneStep => "one_step",
            Level::TwoStep => "two_step",
        }
    }
}

/// An arithmetic operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Add,
    Subtract,
    Multiply,
    Divide,
}

impl Operation {
    pub fn symbol(self) -> &'static str {
        match self {
            Operation::Add => "+",
            Operation::Subtract => "-",
            Operation::Multiply => "*",
            Operation::Divide => "/",
        }
    }

    /// The exact result, or None when it is not a whole number or would be negative.
    pub fn apply(self, left: i64, right: i64) -> Option<i64> {
        match self {
            Operation::Add => Some(left + right),
            Operation::Subtract => (left >= right).then(|| left - right),
            Operation::Multiply => Some(left * right),
            Operation::Divide => (right != 0 && left % right == 0).then(|| left / right),
        }
    }
}

/// One equation of a worked solution: `left op right = result`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub operation: Operation,
    pub left: i64,
    pub right: i64,
    pub result: i64,
}

impl Step {
    fn new(operation: Operation, left: i64, right: i64) -> Option<Step> {
        Some(Step {
            operation,
            left,
            right,
            result: operation.apply(left, right)?,
        })
    }

    /// `7 + 5 = 12`.
    pub fn equation(&self) -> String {
        format!(
            "{} {} {} = {}",
            self.left,
            self.operation.symbol(),
            self.right,
            self.result
        )
    }
}

/// One word problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub level: Level,
    pub question: String,
    /// The worked solution in prose, one sentence per step, without the final-answer line.
    pub solution: String,
    pub steps: Vec<Step>,
    pub answer: i64,
}

impl Problem {
    /// The assistant's reply in the chat format: the worked solution, then `#### <answer>`.
    pub fn chat_solution(&self) -> String {
        format!("{}\n{}", self.solution, final_answer_line(self.answer))
    }

    /// The reward crate's reference for this problem (its answer), as verifiers read it: the
    /// same record GRPO's reward module scores completions against.
    pub fn reference(&self) -> stoke_reward::Reference {
        stoke_reward::Reference {
            answer: Some(self.answer.to_string()),
            ..stoke_reward::Reference::default()
        }
    }
}

/// `#### 42`.
pub fn final_answer_line(answer: i64) -> String {
    format!("{FINAL_ANSWER_PREFIX} {answer}")
}

/// The integer on a completion's last `#### ` line, if it has one (strict format: the line holds
/// the prefix and one integer and nothing else).
pub fn parse_final_answer(completion: &str) -> Option<i64> {
    let line = completion
        .lines()
        .rev()
        .find(|line| line.trim_start().starts_with(FINAL_ANSWER_PREFIX))?;
    line.trim()
        .strip_prefix(FINAL_ANSWER_PREFIX)?
        .trim()
        .parse()
        .ok()
}

/// Which side of the train / held-out partition a question is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Train,
    HeldOut,
}

/// Errors of building or drawing from a task.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("the task needs at least one level")]
    NoLevels,
    #[error("held_out_fraction must be in (0, 1), got {0}")]
    HeldOutFraction(f64),
    #[error(
        "could only draw {found} distinct held-out problems of the {wanted} asked for at levels {levels:?} (the question space is too small)"
    )]
    Exhausted {
        wanted: usize,
        found: usize,
        levels: Vec<Level>,
    },
}

/// A generator of arithmetic word problems at some levels.
#[derive(Clone, Debug, PartialEq)]
pub struct ArithmeticTask {
    levels: Vec<Level>,
    /// Share of the question space that is held out (by question hash).
    held_out_fraction: f64,
}

impl ArithmeticTask {
    /// Problems are drawn from `levels` in turn (uniformly at random per problem).
    pub fn new(levels: Vec<Level>, held_out_fraction: f64) -> Result<Self, TaskError> {
        if levels.is_empty() {
            return Err(TaskError::NoLevels);
        }
        if !(held_out_fraction > 0.0 && held_out_fraction < 1.0) {
            return Err(TaskError::HeldOutFraction(held_out_fraction));
        }
        Ok(ArithmeticTask {
            levels,
            held_out_fraction,
        })
    }

    pub fn levels(&self) -> &[Level] {
        &self.levels
    }

    /// The split a question belongs to: a fixed function of its text alone.
    pub fn split_of(&self, question: &str) -> Split {
        let hash = xxhash_rust::xxh3::xxh3_64_with_seed(question.as_bytes(), SPLIT_HASH_SEED);
        let unit = (hash >> 11) as f64 / (1u64 << 53) as f64;
        if unit < self.held_out_fraction {
            Split::HeldOut
        } else {
            Split::Train
        }
    }

    /// `count` problems of `split`, deterministic in `seed`. Training problems may repeat (a
    /// corpus of any size); held-out problems are distinct.
    pub fn problems(
        &self,
        split: Split,
        count: usize,
        seed: u64,
    ) -> Result<Vec<Problem>, TaskError> {
        // Separate streams per split, so the two sets do not shadow each other's draws.
        let stream = match split {
            Split::Train => 0,
            Split::HeldOut => 1,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        let mut seen = HashSet::new();
        let mut problems = Vec::with_capacity(count);
        // Rejection sampling: the split keeps a fixed share of the space, so the expected number
        // of draws is count / share; the cap only stops a hopeless search in a tiny space.
        let max_draws = 1000 + count.saturating_mul(200);
        let mut draws = 0usize;
        while problems.len() < count {
            if draws >= max_draws {
                return Err(TaskError::Exhausted {
                    wanted: count,
                    found: problems.len(),
                    levels: self.levels.clone(),
                });
            }
            draws += 1;
            let level = *self.levels.choose(&mut rng).unwrap_or(&Level::SingleDigit);
            let problem = draw_problem(level, &mut rng);
            if self.split_of(&problem.question) != split {
                continue;
            }
            if split == Split::HeldOut && !seen.insert(problem.question.clone()) {
                continue;
            }
            problems.push(problem);
        }
        Ok(problems)
    }
}

const SPLIT_HASH_SEED: u64 = 0x5707_e0a1_7e57_0001;

/// (name, subject pronoun, object pronoun)
const PEOPLE: [(&str, &str, &str); 24] = [
    ("Mia", "She", "her"),
    ("Noah", "He", "him"),
    ("Ava", "She", "her"),
    ("Liam", "He", "him"),
    ("Zoe", "She", "her"),
    ("Omar", "He", "him"),
    ("Lena", "She", "her"),
    ("Ravi", "He", "him"),
    ("Sofia", "She", "her"),
    ("Jack", "He", "him"),
    ("Emma", "She", "her"),
    ("Leo", "He", "him"),
    ("Nina", "She", "her"),
    ("Sam", "He", "him"),
    ("Ines", "She", "her"),
    ("Tom", "He", "him"),
    ("Yuki", "She", "her"),
    ("Ben", "He", "him"),
    ("Clara", "She", "her"),
    ("Hugo", "He", "him"),
    ("Maya", "She", "her"),
    ("Ali", "He", "him"),
    ("Rosa", "She", "her"),
    ("Finn", "He", "him"),
];

const OBJECTS: [&str; 24] = [
    "apples", "marbles", "stickers", "pencils", "shells", "cookies", "stamps", "books", "coins",
    "cards", "beads", "plums", "eggs", "buttons", "candles", "rocks", "flowers", "kites", "cups",
    "socks", "grapes", "boats", "toys", "pears",
];

const FRIENDS: [&str; 8] = [
    "a friend",
    "a neighbour",
    "the teacher",
    "a classmate",
    "grandma",
    "a cousin",
    "the coach",
    "an uncle",
];

/// The characters of one story.
struct Cast {
    name: &'static str,
    pronoun: &'static str,
    object_pronoun: &'static str,
    objects: &'static str,
    friend: &'static str,
}

fn cast(rng: &mut ChaCha8Rng) -> Cast {
    let &(name, pronoun, object_pronoun) = PEOPLE.choose(rng).unwrap_or(&PEOPLE[0]);
    Cast {
        name,
        pronoun,
        object_pronoun,
        objects: OBJECTS.choose(rng).unwrap_or(&OBJECTS[0]),
        friend: FRIENDS.choose(rng).unwrap_or(&FRIENDS[0]),
    }
}

fn draw_problem(level: Level, rng: &mut ChaCha8Rng) -> Problem {
    let c = cast(rng);
    // Every branch retries until its numbers satisfy the invariants (exact, >= 2).
    loop {
        let drawn = match level {
            Level::SingleDigit => {
                let operation = *[Operation::Add, Operation::Subtract]
                    .choose(rng)
                    .unwrap_or(&Operation::Add);
                one_step(
                    &c,
                    operation,
                    rng.random_range(2..=9),
                    rng.random_range(2..=9),
                    rng,
                )
            }
            Level::OneStep => {
                let operation = *[
                    Operation::Add,
                    Operation::Subtract,
                    Operation::Multiply,
                    Operation::Divide,
                ]
                .choose(rng)
                .unwrap_or(&Operation::Add);
                let (left, right) = match operation {
                    Operation::Add | Operation::Subtract => {
                        (rng.random_range(2..=50), rng.random_range(2..=50))
                    }
                    Operation::Multiply => (rng.random_range(2..=10), rng.random_range(2..=10)),
                    Operation::Divide => {
                        let (quotient, divisor) =
                            (rng.random_range(2..=10), rng.random_range(2..=10));
                        (quotient * divisor, divisor)
                    }
                };
                one_step(&c, operation, left, right, rng)
            }
            Level::TwoStep => two_step(
                &c,
                rng.random_range(0..4),
                [
                    rng.random_range(2..=20),
                    rng.random_range(2..=20),
                    rng.random_range(2..=20),
                ],
            ),
        };
        if let Some((question, solution, steps)) = drawn {
            let answer = steps.last().map_or(0, |s: &Step| s.result);
            if steps.iter().all(|s| s.result >= 2) {
                return Problem {
                    level,
                    question,
                    solution,
                    steps,
                    answer,
                };
            }
        }
    }
}

type Drawn = Option<(String, String, Vec<Step>)>;

/// One operation, phrased by one of several story templates.
fn one_step(c: &Cast, operation: Operation, a: i64, b: i64, rng: &mut ChaCha8Rng) -> Drawn {
    let step = Step::new(operation, a, b)?;
    let Cast {
        name: n,
        pronoun: p,
        objects: o,
        friend: f,
        ..
    } = *c;
    let eq = step.equation();
    let variant = rng.random_range(0..3);
    let (question, solution) = match (operation, variant) {
        (Operation::Add, 0) => (
            format!("{n} has {a} {o}. {p} buys {b} more. How many {o} does {n} have now?"),
            format!("{n} has {eq} {o} now."),
        ),
        (Operation::Add, 1) => (
            format!(
                "{n} picked {a} {o} in the morning and {b} {o} in the afternoon. How many {o} did {n} pick in all?"
            ),
            format!("{n} picked {eq} {o} in all."),
        ),
        (Operation::Add, _) => (
            format!(
                "There are {a} {o} in a basket. {n} puts {b} more {o} in it. How many {o} are in the basket?"
            ),
            format!("The basket holds {eq} {o}."),
        ),
        (Operation::Subtract, 0) => (
            format!(
                "{n} had {a} {o}. {p} gave {b} of them to {f}. How many {o} does {n} have left?"
            ),
            format!("{n} has {eq} {o} left."),
        ),
        (Operation::Subtract, 1) => (
            format!(
                "A shelf holds {a} {o}. {n} takes {b} {o} off the shelf. How many {o} are still on the shelf?"
            ),
            format!("The shelf still holds {eq} {o}."),
        ),
        (Operation::Subtract, _) => (
            format!("{n} wants {a} {o} and already has {b}. How many more {o} does {n} need?"),
            format!("{n} needs {eq} more {o}."),
        ),
        (Operation::Multiply, 0) => (
            format!(
                "{n} has {a} bags with {b} {o} in each bag. How many {o} does {n} have in total?"
            ),
            format!("{n} has {eq} {o} in total."),
        ),
        (Operation::Multiply, 1) => (
            format!("Each box holds {b} {o}. {n} fills {a} boxes. How many {o} are in the boxes?"),
            format!("The boxes hold {eq} {o}."),
        ),
        (Operation::Multiply, _) => (
            format!(
                "{n} reads {b} pages about {o} every day for {a} days. How many pages does {n} read?"
            ),
            format!("{n} reads {eq} pages."),
        ),
        (Operation::Divide, 0) => (
            format!(
                "{n} shares {a} {o} equally among {b} friends. How many {o} does each friend get?"
            ),
            format!("Each friend gets {eq} {o}."),
        ),
        (Operation::Divide, 1) => (
            format!("{n} packs {a} {o} into bags of {b}. How many bags does {n} fill?"),
            format!("{n} fills {eq} bags."),
        ),
        (Operation::Divide, _) => (
            format!("{a} {o} are split into {b} equal piles. How many {o} are in each pile?"),
            format!("Each pile has {eq} {o}."),
        ),
    };
    Some((question, solution, vec![step]))
}

/// `text` with its first letter upper-cased (a friend starting a sentence).
fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Two chained operations; the first result feeds the second.
fn two_step(c: &Cast, variant: u32, [a, b, d]: [i64; 3]) -> Drawn {
    let Cast {
        name: n,
        pronoun: p,
        object_pronoun: op,
        objects: o,
        friend: f,
    } = *c;
    let (first_op, second_op) = match variant {
        0 => (Operation::Add, Operation::Subtract),
        1 => (Operation::Multiply, Operation::Add),
        2 => (Operation::Multiply, Operation::Subtract),
        _ => (Operation::Add, Operation::Add),
    };
    // Keep products at times tables (the text says "packs of b").
    let (a, b) = match first_op {
        Operation::Multiply => (2 + a % 9, 2 + b % 9),
        _ => (a, b),
    };
    let first = Step::new(first_op, a, b)?;
    let second = Step::new(second_op, first.result, d)?;
    let (e1, e2) = (first.equation(), second.equation());
    let (question, solution) = match variant {
        0 => (
            format!(
                "{n} has {a} {o}. {p} buys {b} more and then gives {d} to {f}. How many {o} does {n} have at the end?"
            ),
            format!("After buying, {n} has {e1} {o}. After giving some away, {n} has {e2} {o}."),
        ),
        1 => (
            format!(
                "{n} buys {a} packs of {o} with {b} in each pack. {friend} gives {op} {d} more. How many {o} does {n} have altogether?",
                friend = capitalized(f)
            ),
            format!("The packs hold {e1} {o}. With the gift, {n} has {e2} {o}."),
        ),
        2 => (
            format!(
                "{n} buys {a} packs of {o} with {b} in each pack and then loses {d} of them. How many {o} does {n} still have?"
            ),
            format!("The packs hold {e1} {o}. After the loss, {n} has {e2} {o}."),
        ),
        _ => (
            format!(
                "{n} found {a} {o} on Monday, {b} on Tuesday and {d} on Wednesday. How many {o} did {n} find over the three days?"
            ),
            format!("Monday and Tuesday give {e1} {o}. Adding Wednesday, {n} found {e2} {o}."),
        ),
    };
    Some((question, solution, vec![first, second]))
}
