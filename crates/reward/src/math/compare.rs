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

use super::expr::{Bindings, Bracket, Expr, Func, NoBindings, RelOp};

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
    // Both sides rational by form, yet one has no exact value (too many bits, a factorial
    // past the limit, a division by zero): f64 would call `2 + 10^{-10^8}` equal to 2, so
    // there is no verdict here rather than a tolerance match.
    if rational_form(gold) && rational_form(pred) {
        return PointVerdict::Undefined;
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

fn is_open(op: RelOp) -> Option<bool> {
    match op {
        RelOp::Less | RelOp::Greater => Some(true),
        RelOp::LessEq | RelOp::GreaterEq => Some(false),
        _ => None,
    }
}

fn bracket(open: bool) -> Bracket {
    if open {
        Bracket::Round
    } else {
        Bracket::Square
    }
}

fn interval(lo: Expr, lo_open: bool, hi: Expr, hi_open: bool) -> Expr {
    Expr::Tuple(vec![lo, hi], bracket(lo_open), bracket(hi_open))
}

fn negative_infinity() -> Expr {
    Expr::Neg(Box::new(Expr::Infinity))
}

/// An inequality in one variable as an interval, when it is one.
fn inequality_interval(operands: &[Expr], ops: &[RelOp]) -> Option<Expr> {
    let is_var = |e: &Expr| matches!(e, Expr::Var(_));
    match (operands, ops) {
        ([a, x, b], [op1, op2]) if is_var(x) => {
            let (open1, open2) = (is_open(*op1)?, is_open(*op2)?);
            let ascending = matches!(op1, RelOp::Less | RelOp::LessEq)
                && matches!(op2, RelOp::Less | RelOp::LessEq);
            let descending = matches!(op1, RelOp::Greater | RelOp::GreaterEq)
                && matches!(op2, RelOp::Greater | RelOp::GreaterEq);
            if ascending {
                Some(interval(a.clone(), open1, b.clone(), open2))
            } else if descending {
                Some(interval(b.clone(), open2, a.clone(), open1))
            } else {
                None
            }
        }
        ([x, a], [op]) | ([a, x], [op]) if is_var(x) => {
            let open = is_open(*op)?;
            let var_first = is_var(&operands[0]) && !is_var(&operands[1]);
            // Read as `x op a`; `a op x` flips the direction.
            let upper = matches!(op, RelOp::Less | RelOp::LessEq) == var_first;
            Some(if upper {
                interval(negative_infinity(), true, a.clone(), open)
            } else {
                interval(a.clone(), open, Expr::Infinity, true)
            })
        }
        _ => None,
    }
}

/// Reduces equations with a variable on one side to the other side, inequalities to intervals
/// and `x \in S` to `S`, recursively through lists and sets.
pub fn canonical(expr: &Expr) -> Expr {
    match expr {
        Expr::Relation(operands, ops) => {
            if let ([Expr::Var(_), value], [RelOp::Eq | RelOp::In]) = (&operands[..], &ops[..]) {
                return canonical(value);
            }
            if let ([value, Expr::Var(_)], [RelOp::Eq]) = (&operands[..], &ops[..]) {
                return canonical(value);
            }
            inequality_interval(operands, ops).unwrap_or_else(|| expr.clone())
        }
        Expr::List(items) => Expr::List(items.iter().map(canonical).collect()),
        Expr::Set(items) => Expr::Set(items.iter().map(canonical).collect()),
        Expr::Union(items) => Expr::Union(items.iter().map(canonical).collect()),
        Expr::Tuple(items, open, close) => {
            Expr::Tuple(items.iter().map(canonical).collect(), *open, *close)
        }
        other => other.clone(),
    }
}

fn unordered_equal(gold: &[Expr], pred: &[Expr], tolerance: &Tolerance) -> bool {
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
        Expr::Text(text) => {
            let letters: String = text.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
            (letters.len() == 1).then_some(letters)
        }
        _ => None,
    }
}

fn structurally_equal(gold: &Expr, pred: &Expr, tolerance: &Tolerance) -> bool {
    match (gold, pred) {
        (Expr::Text(a), Expr::Text(b)) => a == b,
        (Expr::Text(_), _) | (_, Expr::Text(_)) => {
            letter_of(gold).is_some_and(|letter| letter_of(pred) == Some(letter))
        }
        (Expr::List(g) | Expr::Set(g), Expr::List(p) | Expr::Set(p))
        | (Expr::Union(g), Expr::Union(p)) => unordered_equal(g, p, tolerance),
        (Expr::Set(g) | Expr::List(g), single) if g.len() == 1 && single.is_scalar() => {
            structurally_equal(&g[0], single, tolerance)
        }
        (single, Expr::Set(p) | Expr::List(p)) if p.len() == 1 && single.is_scalar() => {
            structurally_equal(single, &p[0], tolerance)
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

/// True when `pred` is an acceptable answer for `gold`.
pub fn equivalent(gold: &Expr, pred: &Expr, tolerance: &Tolerance) -> bool {
    let (gold_canonical, pred_canonical) = (canonical(gold), canonical(pred));
    if structurally_equal(&gold_canonical, &pred_canonical, tolerance) {
        return true;
    }
    // `y = 2x + 1` against `2x - y = -1`: compare as equations when both were equations, unless
    // the gold is a solved value (`x = 3`), which an unsolved `2x = 6` must not match.
    match (gold, pred) {
        (Expr::Relation(g, g_ops), Expr::Relation(p, p_ops))
            if g_ops == &[RelOp::Eq] && p_ops == &[RelOp::Eq] && !is_solved_value(g) =>
        {
            equations_equal(g, p, tolerance)
        }
        _ => false,
    }
}
