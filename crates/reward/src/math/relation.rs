//! Canonical forms of relations before comparison: labels dropped (`(p,q)=(3,2)` is `(3,2)`,
//! `f(x)=1` is `1`), chained equalities read as their last side (`x = 5+5+1 = 11` is 11),
//! `\approx` read as the exact side before it, and inequalities in one variable solved into
//! intervals (`-x > -1` is `(-\infty, 1)`, `5 \geq x` is `(-\infty, 5]`).
//!
//! What this is not: an equation solver. Only labels (a variable, a product or ratio of
//! variables, `|AB|`, a tuple of variables, `f(x)`) are dropped; `2x + z = 1` stays an equation
//! and never equals 1. Only linear inequalities in one variable with an exact coefficient are
//! solved.
//!
//! Invariants: `canonical` never invents a value: its result is one of the relation's own sides
//! or an interval whose ends are computed exactly from them.

use num_rational::BigRational;
use num_traits::{Signed, Zero};

use super::expr::{Bracket, Expr, Func, NoBindings, RelOp};

/// Whether `expr` names a quantity rather than computing one: `x`, `a_3`, `AB`, `V_1:V_2`,
/// `|AB|`, `(p, q)`, `f(x)`.
pub fn is_label(expr: &Expr) -> bool {
    match expr {
        Expr::Var(_) => true,
        Expr::Mul(a, b) | Expr::Div(a, b) => is_label(a) && is_label(b),
        Expr::Apply(Func::Abs, a) => is_label(a),
        Expr::Tuple(items, Bracket::Round, Bracket::Round) => items.iter().all(is_label),
        _ => false,
    }
}

fn variables(expr: &Expr) -> Vec<String> {
    let mut names = Vec::new();
    expr.variables(&mut names);
    names
}

/// `label = value`: the value, when the label is not also a variable of the value (except as
/// a function's argument: `f(x) = x^2 + 1`).
fn labeled_value<'e>(label: &Expr, value: &'e Expr) -> Option<&'e Expr> {
    if !is_label(label) {
        return None;
    }
    let value_names = variables(value);
    if value_names.is_empty() {
        return Some(value);
    }
    let named = match label {
        Expr::Var(name) => vec![name.clone()],
        Expr::Mul(f, _) if matches!(**f, Expr::Var(_)) => variables(f),
        _ => return None,
    };
    named
        .iter()
        .all(|name| !value_names.contains(name))
        .then_some(value)
}

/// Whether a relation's operands are a list of labeled values (`a_3 = 2, a_{37} = 19`).
pub fn is_labeled_equation(expr: &Expr) -> bool {
    matches!(expr, Expr::Relation(sides, ops)
        if ops == &[RelOp::Eq] && labeled_value(&sides[0], &sides[1]).is_some())
}

fn is_open(op: RelOp) -> Option<bool> {
    match op {
        RelOp::Less | RelOp::Greater => Some(true),
        RelOp::LessEq | RelOp::GreaterEq => Some(false),
        _ => None,
    }
}

fn flip(op: RelOp) -> RelOp {
    match op {
        RelOp::Less => RelOp::Greater,
        RelOp::Greater => RelOp::Less,
        RelOp::LessEq => RelOp::GreaterEq,
        RelOp::GreaterEq => RelOp::LessEq,
        other => other,
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

fn constant(expr: &Expr) -> bool {
    variables(expr).is_empty()
}

/// `a*v + b` with exact rationals `a != 0`, `b`: the variable's name, `a` and `b`.
fn linear(expr: &Expr) -> Option<(String, BigRational, BigRational)> {
    let names = variables(expr);
    let [name] = names.as_slice() else {
        return None;
    };
    struct At<'a>(&'a str, i64);
    impl super::expr::Bindings for At<'_> {
        fn exact(&self, name: &str) -> Option<BigRational> {
            (name == self.0).then(|| BigRational::from_integer(self.1.into()))
        }
        fn approx(&self, name: &str) -> Option<f64> {
            (name == self.0).then_some(self.1 as f64)
        }
    }
    let b = expr.eval_exact(&At(name, 0))?;
    let a = expr.eval_exact(&At(name, 1))? - &b;
    let at_two = expr.eval_exact(&At(name, 2))?;
    let at_seven = expr.eval_exact(&At(name, 7))?;
    let two = BigRational::from_integer(2.into());
    let seven = BigRational::from_integer(7.into());
    (!a.is_zero() && at_two == &a * two + &b && at_seven == &a * seven + &b)
        .then(|| (name.clone(), a, b))
}

/// `side op bound` with `side` linear in one variable: `v op' bound'` (op flipped when the
/// coefficient is negative).
fn solve(side: &Expr, op: RelOp, bound: &Expr) -> Option<(Expr, RelOp, Expr)> {
    if matches!(side, Expr::Var(_)) || is_label(side) {
        return Some((side.clone(), op, bound.clone()));
    }
    let (name, a, b) = linear(side)?;
    let bound = bound.eval_exact(&NoBindings)?;
    let solved = (bound - b) / &a;
    let op = if a.is_negative() { flip(op) } else { op };
    Some((Expr::Var(name), op, Expr::Num(solved)))
}

/// An inequality in one variable as an interval, when it is one.
fn inequality_interval(operands: &[Expr], ops: &[RelOp]) -> Option<Expr> {
    match (operands, ops) {
        ([lo, middle, hi], [op1, op2]) if (is_label(middle)) && constant(lo) && constant(hi) => {
            let (open1, open2) = (is_open(*op1)?, is_open(*op2)?);
            let ascending = matches!(op1, RelOp::Less | RelOp::LessEq)
                && matches!(op2, RelOp::Less | RelOp::LessEq);
            let descending = matches!(op1, RelOp::Greater | RelOp::GreaterEq)
                && matches!(op2, RelOp::Greater | RelOp::GreaterEq);
            if ascending {
                Some(interval(lo.clone(), open1, hi.clone(), open2))
            } else if descending {
                Some(interval(hi.clone(), open2, lo.clone(), open1))
            } else {
                None
            }
        }
        ([left, right], [op]) => {
            is_open(*op)?;
            let (_, op, bound) = if constant(right) && !constant(left) {
                solve(left, *op, right)?
            } else if constant(left) && !constant(right) {
                solve(right, flip(*op), left)?
            } else {
                return None;
            };
            let open = is_open(op)?;
            Some(if matches!(op, RelOp::Less | RelOp::LessEq) {
                interval(Expr::Neg(Box::new(Expr::Infinity)), true, bound, open)
            } else {
                interval(bound, open, Expr::Infinity, true)
            })
        }
        _ => None,
    }
}

/// The answer a relation states, or the relation itself when it states no single value.
fn canonical_relation(expr: &Expr, operands: &[Expr], ops: &[RelOp]) -> Expr {
    if let Some(first_approx) = ops.iter().position(|op| *op == RelOp::Approx) {
        // `x = 1/3 \approx 0.33`: the exact side; `x \approx 11`: the approximation.
        if first_approx > 0 && ops[..first_approx].iter().all(|op| *op == RelOp::Eq) {
            return canonical(&operands[first_approx]);
        }
        if first_approx == 0 && ops.len() == 1 && is_label(&operands[0]) {
            return canonical(&operands[1]);
        }
        return expr.clone();
    }
    let all_equal = ops.iter().all(|op| *op == RelOp::Eq);
    let last = &operands[operands.len() - 1];
    if all_equal && operands.len() >= 3 && constant(last) {
        return canonical(last);
    }
    if all_equal && operands.iter().all(constant) {
        // `17 + 1 = 18`: the result.
        return canonical(last);
    }
    match (operands, ops) {
        ([label, value], [RelOp::Eq | RelOp::In]) if labeled_value(label, value).is_some() => {
            canonical(value)
        }
        ([value, Expr::Var(_)], [RelOp::Eq]) => canonical(value),
        _ => inequality_interval(operands, ops).unwrap_or_else(|| expr.clone()),
    }
}

/// Reduces labeled values to their value, chained equalities to their last side,
/// inequalities to intervals and `x \in S` to `S`, recursively through lists and sets.
pub fn canonical(expr: &Expr) -> Expr {
    match expr {
        Expr::Relation(operands, ops) => canonical_relation(expr, operands, ops),
        Expr::List(items) => Expr::List(items.iter().map(canonical).collect()),
        Expr::Set(items) => Expr::Set(items.iter().map(canonical).collect()),
        Expr::Union(items) => Expr::Union(items.iter().map(canonical).collect()),
        Expr::Tuple(items, open, close) => {
            Expr::Tuple(items.iter().map(canonical).collect(), *open, *close)
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::parser::parse_answer;

    fn canon(text: &str) -> Expr {
        canonical(&parse_answer(text).unwrap())
    }

    #[test]
    fn labels_are_dropped_but_equations_stay() {
        assert_eq!(canon("(p,q)=(3,2)"), canon("(3,2)"));
        assert_eq!(canon("f(x)=1"), Expr::int(1));
        assert_eq!(canon("|AB|=1"), Expr::int(1));
        assert!(matches!(canon("2x + z = 1"), Expr::Relation(..)));
        assert!(matches!(canon("7 = 11a+c"), Expr::Relation(..)));
    }

    #[test]
    fn chains_take_the_last_side_and_approx_the_exact_one() {
        assert_eq!(canon("x = 5+5+1 = 7 = 11"), Expr::int(11));
        assert_eq!(canon("17 + 1 = 18"), Expr::int(18));
        assert_eq!(canon("x = 1/3 \\approx 0.33"), canon("1/3"));
        assert_eq!(canon("x \\approx 11"), Expr::int(11));
    }

    #[test]
    fn linear_inequalities_become_intervals() {
        assert_eq!(canon("-x > -1"), canon("x < 1"));
        assert_eq!(canon("5 \\geq x"), canon("x \\leq 5"));
        assert_eq!(canon("2x + 1 \\le 7"), canon("x \\le 3"));
        assert_ne!(canon("-x > -1"), canon("x > -1"));
    }
}
