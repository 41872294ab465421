//! Equivalence of a parsed gold answer and a parsed prediction.
//!
//! Numbers compare exactly (big rationals) whenever both sides are rational; irrational values
//! (`\sqrt{2}`, `\pi`) compare in f64 with a relative tolerance; expressions with variables
//! compare by evaluation at fixed sample points (exact where possible). Structures compare
//! structurally: tuples and intervals in order with their brackets, sets and top-level lists as
//! multisets. Equations `x = 3` reduce to their right-hand side; inequalities become intervals,
//! so a gold `1 < x < 2` accepts `(1, 2)`.
//!
//! What this is not: a proof of equivalence. Evaluation at points can be fooled by expressions
//! that agree on every sample point; the points are fixed non-integer rationals chosen to make
//! coincidences unlikely for answer-sized expressions, of both signs (`point_sign`), so `|x|` is
//! not `x`. Fixed points are knowable, but a policy cannot aim at them: it sees only the
//! question, never the points.

use num_rational::BigRational;
use num_traits::One;

use super::expr::{Bindings, Bracket, Expr, Func, NoBindings, RelOp};
use super::matrix::{involves_matrix, reduce, vector_entries};
use super::relation::{canonical, is_labeled_equation};

/// How close two irrational values must be (relative), and how many sample points decide
/// symbolic equivalence.
#[derive(Debug, Clone, Copy)]
pub struct Tolerance {
    pub relative: f64,
    pub sample_points: usize,
}

/// Most items in a set or list compared pairwise (bounds the quadratic matching).
const MAX_ITEMS: usize = 64;

const NUMERATORS: [i64; 8] = [13, 29, 41, 17, 53, 37, 61, 23];
const DENOMINATORS: [i64; 5] = [7, 11, 5, 13, 3];

/// The sign of variable `index` at sample point `point`. The first two points are positive
/// (so expressions defined only for positive values, `\sqrt{x}` or `\ln x`, still get two
/// defined points); the rest walk through sign patterns (`x` negative at every other point, `y`
/// every other pair, ...), because with only positive points `|x|` equals `x`, `\sqrt{x^2}`
/// equals `x` and `\frac{x}{|x|}` equals 1.
fn point_sign(point: usize, index: usize) -> i64 {
    let Some(pattern) = point.checked_sub(2) else {
        return 1;
    };
    if (pattern >> (index % 3)) & 1 == 1 {
        -1
    } else {
        1
    }
}

struct PointBindings<'a> {
    names: &'a [String],
    point: usize,
}

impl PointBindings<'_> {
    fn value(&self, name: &str) -> Option<(i64, i64)> {
        let index = self.names.iter().position(|n| n == name)?;
        let numer = NUMERATORS[(index * 3 + self.point) % NUMERATORS.len()] + self.point as i64;
        let denom = DENOMINATORS[(index + 2 * self.point) % DENOMINATORS.len()];
        Some((numer * point_sign(self.point, index), denom))
    }
}

impl Bindings for PointBindings<'_> {
    fn exact(&self, name: &str) -> Option<BigRational> {
        self.value(name)
            .map(|(n, d)| BigRational::new(n.into(), d.into()))
    }
    fn approx(&self, name: &str) -> Option<f64> {
        self.value(name).map(|(n, d)| n as f64 / d as f64)
    }
}

/// The numeric verdict at one point.
enum PointVerdict {
    Equal,
    Different,
    Undefined,
}

fn close(a: f64, b: f64, tolerance: &Tolerance) -> PointVerdict {
    if a.is_nan() || b.is_nan() {
        return PointVerdict::Undefined;
    }
    if a.is_infinite() || b.is_infinite() {
        return if a == b {
            PointVerdict::Equal
        } else {
            PointVerdict::Different
        };
    }
    let scale = a.abs().max(b.abs()).max(1e-12);
    if (a - b).abs() <= tolerance.relative * scale {
        PointVerdict::Equal
    } else {
        PointVerdict::Different
    }
}

fn contains_factorial(expr: &Expr) -> bool {
    match expr {
        Expr::Factorial(_) => true,
        Expr::Neg(a) | Expr::Percent(a) | Expr::Apply(_, a) => contains_factorial(a),
        Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Div(a, b) | Expr::Pow(a, b) => {
            contains_factorial(a) || contains_factorial(b)
        }
        _ => false,
    }
}

fn is_infinity_literal(expr: &Expr) -> bool {
    match expr {
        Expr::Infinity => true,
        Expr::Neg(inner) => is_infinity_literal(inner),
        _ => false,
    }
}

/// Whether `expr` is built only from rationals, variables and operations that keep values
/// rational (integer powers, `|.|`, factorials, percentages), so that its value is exact
/// whenever it can be computed at all.
fn rational_form(expr: &Expr) -> bool {
    match expr {
        Expr::Num(_) | Expr::Var(_) => true,
        Expr::Neg(a) | Expr::Factorial(a) | Expr::Percent(a) | Expr::Apply(Func::Abs, a) => {
            rational_form(a)
        }
        Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Div(a, b) => {
            rational_form(a) && rational_form(b)
        }
        Expr::Pow(base, exponent) => {
            rational_form(base)
                && exponent
                    .eval_exact(&NoBindings)
                    .is_some_and(|value| value.is_integer())
        }
        _ => false,
    }
}

fn compare_at(
    gold: &Expr,
    pred: &Expr,
    vars: &dyn Bindings,
    tolerance: &Tolerance,
) -> PointVerdict {
    if let (Some(a), Some(b)) = (gold.eval_exact(vars), pred.eval_exact(vars)) {
        return if a == b {
            PointVerdict::Equal
        } else {
            PointVerdict::Different
        };
    }
    // `(n+1)!` against `(n+1) n!`: neither side has a value at a non-integer point, their
    // quotient does (its factorials pair across the fraction bar, `closed_form.rs`).
    if contains_factorial(gold) && contains_factorial(pred) {
        let quotient = Expr::Div(Box::new(gold.clone()), Box::new(pred.clone()));
        if let Some(value) = quotient.eval_exact(vars) {
            return if value.is_one() {
                PointVerdict::Equal
            } else {
                PointVerdict::Different
            };
        }
    }
    // Both sides rational by form, yet one has no exact value (too many bits, a factorial
    // past the limit, a division by zero): f64 would call `2 + 10^{-10^8}` equal to 2, so
    // there is no verdict here rather than a tolerance match.
    if rational_form(gold) && rational_form(pred) {
        return PointVerdict::Undefined;
    }
    // An irrational gold (`\sqrt{2}`, `\pi`) is never matched by a rational number
    // (`1.41421356`, `\frac{99}{70}`): a close approximation is not the exact answer. The
    // converse stays: a gold decimal (`4.1231056`) accepts the exact `\sqrt{17}` it rounds.
    if gold.eval_exact(vars).is_none() && rational_form(pred) && pred.eval_exact(vars).is_some() {
        return PointVerdict::Different;
    }
    let (a, b) = (gold.eval_f64(vars), pred.eval_f64(vars));
    // Overflow to infinity says nothing about equality (`10^{10^{10}}` vs `10^{10^9}`); only
    // a written `\infty` (an interval end) is a value.
    let overflowed = |value: f64, expr: &Expr| value.is_infinite() && !is_infinity_literal(expr);
    if overflowed(a, gold) || overflowed(b, pred) {
        return PointVerdict::Undefined;
    }
    close(a, b, tolerance)
}

/// Scalar equality: exact, numeric, or symbolic by evaluation at points.
fn scalar_equal(gold: &Expr, pred: &Expr, tolerance: &Tolerance) -> bool {
    if gold == pred {
        return true;
    }
    let mut names = Vec::new();
    gold.variables(&mut names);
    pred.variables(&mut names);
    if names.is_empty() {
        return matches!(
            compare_at(gold, pred, &NoBindings, tolerance),
            PointVerdict::Equal
        );
    }
    let mut defined = 0;
    for point in 0..tolerance.sample_points {
        let bindings = PointBindings {
            names: &names,
            point,
        };
        match compare_at(gold, pred, &bindings, tolerance) {
            PointVerdict::Equal => defined += 1,
            PointVerdict::Different => return false,
            PointVerdict::Undefined => {}
        }
    }
    defined >= 2.min(tolerance.sample_points)
}

/// Scalar equality that also reads a percentage as its number: `50\%` matches `50` (face
/// value, the rule of HuggingFace's math-verify, which drops the sign) and `0.5` (its value).
/// So a prediction `P\%` matches gold P and gold P/100, never 100P; a bare number never matches
/// a gold scaled by 100 (Qwen2.5-Math's grader accepts gold 50 for 0.5 and 5000; this does
/// not).
fn scalar_equivalent(gold: &Expr, pred: &Expr, tolerance: &Tolerance) -> bool {
    if scalar_equal(gold, pred, tolerance) {
        return true;
    }
    match (gold, pred) {
        // Both written as percentages: their values already compared (`50\%` is not `0.5\%`).
        (Expr::Percent(_), Expr::Percent(_)) => false,
        (_, Expr::Percent(inner)) => scalar_equal(gold, inner, tolerance),
        (Expr::Percent(inner), _) => scalar_equal(inner, pred, tolerance),
        _ => false,
    }
}

/// The items without repeats: `(3,17,3,7)` listed twice is one solution.
fn distinct<'e>(items: &'e [Expr], tolerance: &Tolerance) -> Vec<&'e Expr> {
    let mut kept: Vec<&Expr> = Vec::new();
    for item in items.iter().take(MAX_ITEMS + 1) {
        if !kept
            .iter()
            .any(|seen| structurally_equal(seen, item, tolerance))
        {
            kept.push(item);
        }
    }
    kept
}

fn unordered_equal(gold: &[Expr], pred: &[Expr], tolerance: &Tolerance) -> bool {
    let gold: Vec<&Expr> = gold.iter().collect();
    let pred: Vec<&Expr> = pred.iter().collect();
    unordered_equal_refs(&gold, &pred, tolerance)
}

fn unordered_equal_refs(gold: &[&Expr], pred: &[&Expr], tolerance: &Tolerance) -> bool {
    if gold.len() != pred.len() || gold.len() > MAX_ITEMS {
        return false;
    }
    let mut used = vec![false; pred.len()];
    'gold: for g in gold {
        for (index, p) in pred.iter().enumerate() {
            if !used[index] && structurally_equal(g, p, tolerance) {
                used[index] = true;
                continue 'gold;
            }
        }
        return false;
    }
    true
}

/// Both sides are `lhs = rhs` equations; equal when `lhs - rhs` of one is a non-zero multiple
/// of the other at every sample point (`x + y = 1` matches `2y = 2 - 2x`).
fn equations_equal(gold: &[Expr], pred: &[Expr], tolerance: &Tolerance) -> bool {
    let difference =
        |sides: &[Expr]| Expr::Sub(Box::new(sides[0].clone()), Box::new(sides[1].clone()));
    let (gold_diff, pred_diff) = (difference(gold), difference(pred));
    let mut names = Vec::new();
    gold_diff.variables(&mut names);
    pred_diff.variables(&mut names);
    let mut ratio: Option<f64> = None;
    let mut defined = 0;
    for point in 0..tolerance.sample_points {
        let bindings = PointBindings {
            names: &names,
            point,
        };
        let (g, p) = (gold_diff.eval_f64(&bindings), pred_diff.eval_f64(&bindings));
        if !g.is_finite() || !p.is_finite() {
            continue;
        }
        if g.abs() < 1e-12 {
            if p.abs() > 1e-9 {
                return false;
            }
            continue;
        }
        let here = p / g;
        match ratio {
            None if here.abs() < 1e-12 => return false,
            None => ratio = Some(here),
            Some(r) => {
                if !matches!(close(r, here, tolerance), PointVerdict::Equal) {
                    return false;
                }
            }
        }
        defined += 1;
    }
    defined >= 2 && ratio.is_some()
}

fn letter_of(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Var(name) if name.len() == 1 => Some(name.to_ascii_lowercase()),
        Expr::E => Some("e".into()),
        Expr::Text(text) => {
            let letters: String = text.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
            (letters.len() == 1).then_some(letters)
        }
        _ => None,
    }
}

fn structurally_equal(gold: &Expr, pred: &Expr, tolerance: &Tolerance) -> bool {
    match (gold, pred) {
        (Expr::Text(a), Expr::Text(b)) => {
            a == b || letter_of(gold).is_some_and(|letter| letter_of(pred) == Some(letter))
        }
        (Expr::Text(_), _) | (_, Expr::Text(_)) => {
            letter_of(gold).is_some_and(|letter| letter_of(pred) == Some(letter))
        }
        // A list of solutions may repeat one (`(3,17,3,7)` twice); set notation may not.
        (Expr::List(g), Expr::List(p)) => {
            let (g, p) = (distinct(g, tolerance), distinct(p, tolerance));
            unordered_equal_refs(&g, &p, tolerance)
        }
        (Expr::List(g) | Expr::Set(g), Expr::List(p) | Expr::Set(p))
        | (Expr::Union(g), Expr::Union(p)) => unordered_equal(g, p, tolerance),
        (Expr::Set(g) | Expr::List(g), single) if g.len() == 1 && single.is_scalar() => {
            structurally_equal(&g[0], single, tolerance)
        }
        (single, Expr::Set(p) | Expr::List(p)) if p.len() == 1 && single.is_scalar() => {
            structurally_equal(single, &p[0], tolerance)
        }
        (Expr::Time(a), Expr::Time(b)) => a == b,
        (g, p) if involves_matrix(g) || involves_matrix(p) => matrices_equal(g, p, tolerance),
        // `(1, 3)` against `{1, 3}` (a TeX group) or `1, 3`: compared in order; `\{1, 3\}` is a set.
        (Expr::Tuple(g, Bracket::Round, Bracket::Round), Expr::List(p))
        | (Expr::List(g), Expr::Tuple(p, Bracket::Round, Bracket::Round))
            if g.len() == p.len() && g.len() > 1 =>
        {
            g.iter()
                .zip(p)
                .all(|(a, b)| structurally_equal(a, b, tolerance))
        }
        (Expr::Tuple(g, g_open, g_close), Expr::Tuple(p, p_open, p_close)) => {
            g_open == p_open
                && g_close == p_close
                && g.len() == p.len()
                && g.iter()
                    .zip(p)
                    .all(|(a, b)| structurally_equal(a, b, tolerance))
        }
        (Expr::Relation(g, g_ops), Expr::Relation(p, p_ops)) => {
            if g_ops == &[RelOp::Eq] && p_ops == &[RelOp::Eq] {
                return equations_equal(g, p, tolerance);
            }
            g_ops == p_ops
                && g.iter()
                    .zip(p)
                    .all(|(a, b)| structurally_equal(a, b, tolerance))
        }
        (a, b) if a.is_scalar() && b.is_scalar() => scalar_equivalent(a, b, tolerance),
        _ => false,
    }
}

/// `x = 3` (or `3 = x`): a variable equal to a value without variables.
fn is_solved_value(sides: &[Expr]) -> bool {
    let constant = |e: &Expr| {
        let mut names = Vec::new();
        e.variables(&mut names);
        names.is_empty()
    };
    match sides {
        [Expr::Var(_), value] | [value, Expr::Var(_)] => constant(value),
        _ => false,
    }
}

/// Matrices (after their arithmetic) entry by entry and of the same shape; a tuple matches a
/// one-row or one-column matrix with the same entries in order.
fn matrices_equal(gold: &Expr, pred: &Expr, tolerance: &Tolerance) -> bool {
    let entries_equal = |a: Vec<&Expr>, b: Vec<&Expr>| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| structurally_equal(x, y, tolerance))
    };
    match (reduce(gold), reduce(pred)) {
        (Some(g), Some(p)) => {
            g.len() == p.len()
                && g.iter()
                    .zip(&p)
                    .all(|(gr, pr)| entries_equal(gr.iter().collect(), pr.iter().collect()))
        }
        (Some(g), None) => match (vector_entries(&g), pred) {
            (Some(entries), Expr::Tuple(items, Bracket::Round, Bracket::Round)) => {
                entries_equal(entries, items.iter().collect())
            }
            _ => false,
        },
        (None, Some(p)) => match (gold, vector_entries(&p)) {
            (Expr::Tuple(items, Bracket::Round, Bracket::Round), Some(entries)) => {
                entries_equal(items.iter().collect(), entries)
            }
            _ => false,
        },
        (None, None) => false,
    }
}

/// The verdict and the comparison rule that reached it (for `stoke verify --explain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub equal: bool,
    pub rule: &'static str,
}

/// The rule that compares two canonical answers of these shapes.
fn rule_for(gold: &Expr, pred: &Expr) -> &'static str {
    if involves_matrix(gold) || involves_matrix(pred) {
        return "matrix entries, same shape";
    }
    match (gold, pred) {
        (Expr::Text(_), _) | (_, Expr::Text(_)) => "text or choice letter",
        (Expr::Time(_), _) | (_, Expr::Time(_)) => "clock time",
        (Expr::Tuple(..), _) | (_, Expr::Tuple(..)) => "tuple or interval, in order",
        (Expr::List(_) | Expr::Set(_) | Expr::Union(_), _)
        | (_, Expr::List(_) | Expr::Set(_) | Expr::Union(_)) => "set or list, unordered",
        (Expr::Relation(..), _) | (_, Expr::Relation(..)) => "relation",
        _ => {
            let mut names = Vec::new();
            gold.variables(&mut names);
            pred.variables(&mut names);
            if !names.is_empty() {
                "symbolic, at sample points"
            } else if gold.eval_exact(&NoBindings).is_some()
                && pred.eval_exact(&NoBindings).is_some()
            {
                "exact rational"
            } else {
                "numeric, relative tolerance"
            }
        }
    }
}

fn labeled_list(expr: &Expr) -> Option<&[Expr]> {
    match expr {
        Expr::List(items) | Expr::Set(items) if items.iter().all(is_labeled_equation) => {
            Some(items)
        }
        _ => None,
    }
}

/// Decides whether `pred` is an acceptable answer for `gold`, and by which rule.
pub fn decide(gold: &Expr, pred: &Expr, tolerance: &Tolerance) -> Decision {
    // `a_3 = 2, a_{37} = 19` on both sides: the labels must match too.
    if let (Some(g), Some(p)) = (labeled_list(gold), labeled_list(pred)) {
        return Decision {
            equal: unordered_equal(g, p, tolerance),
            rule: "labeled values, unordered",
        };
    }
    let (gold_canonical, pred_canonical) = (canonical(gold), canonical(pred));
    let rule = rule_for(&gold_canonical, &pred_canonical);
    if structurally_equal(&gold_canonical, &pred_canonical, tolerance) {
        return Decision { equal: true, rule };
    }
    // `y = 2x + 1` against `2x - y = -1`: compare as equations when both were equations, unless
    // the gold is a solved value (`x = 3`), which an unsolved `2x = 6` must not match.
    let equal = match (gold, pred) {
        (Expr::Relation(g, g_ops), Expr::Relation(p, p_ops))
            if g_ops == &[RelOp::Eq] && p_ops == &[RelOp::Eq] && !is_solved_value(g) =>
        {
            equations_equal(g, p, tolerance)
        }
        _ => false,
    };
    Decision {
        equal,
        rule: if equal {
            "equations, up to a factor"
        } else {
            rule
        },
    }
}

/// True when `pred` is an acceptable answer for `gold`.
pub fn equivalent(gold: &Expr, pred: &Expr, tolerance: &Tolerance) -> bool {
    decide(gold, pred, tolerance).equal
}
