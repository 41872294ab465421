//! The parsed form of a math answer (`Expr`) and its evaluation: exactly, with big rationals,
//! where the expression is rational; in f64 where it is not (square roots of non-squares, `\pi`,
//! fractional powers); both with variables bound to sample points.
//!
//! What this is not: a computer-algebra system. Symbolic equivalence is decided by evaluation at
//! points (see `compare.rs`), not by rewriting.
//!
//! Functions of numbers (logs, trig, inverse trig, `e^x`) and products or quotients of
//! factorials get their exact value from `closed_form.rs` when it is rational (`\log_2 8` is 3,
//! `\frac{(n+1)!}{n!}` is n+1 at every point), else their f64 value.
//!
//! Invariants: every evaluation is bounded. Exact powers are refused (the caller falls back to
//! f64) when the result would exceed `MAX_EXACT_BITS`; factorials stop at `MAX_FACTORIAL` unless
//! they cancel in a quotient (`closed_form.rs`); the tree depth is bounded by the parser.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

use super::closed_form;

/// Largest exact intermediate, in bits; beyond it evaluation is refused (`10^10^10` must not
/// allocate gigabytes).
pub const MAX_EXACT_BITS: u64 = 4096;
/// Largest argument of an exact factorial.
pub const MAX_FACTORIAL: u64 = 200;

/// Shape of an opening or closing bracket, kept to tell intervals `[1,2)` from tuples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bracket {
    Round,
    Square,
}

/// A comparison operator in a relation chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelOp {
    Eq,
    Less,
    LessEq,
    Greater,
    GreaterEq,
    NotEq,
    /// `x \in [1,2)`: membership, read as "x is described by the right-hand side".
    In,
    /// `x \approx 1.41`: the side before the first `\approx` is the answer (see `compare.rs`).
    Approx,
}

/// Elementary functions the parser knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Sin,
    Cos,
    Tan,
    Sec,
    Csc,
    Cot,
    Asin,
    Acos,
    Atan,
    Ln,
    Log10,
    Exp,
    Abs,
}

impl Func {
    /// The function a LaTeX command or plain word names (`\\sin`, `sin`, `arcsin`).
    pub fn named(name: &str) -> Option<Func> {
        Some(match name {
            "sin" => Func::Sin,
            "cos" => Func::Cos,
            "tan" => Func::Tan,
            "sec" => Func::Sec,
            "csc" | "cosec" => Func::Csc,
            "cot" => Func::Cot,
            "arcsin" | "asin" => Func::Asin,
            "arccos" | "acos" => Func::Acos,
            "arctan" | "atan" => Func::Atan,
            "ln" => Func::Ln,
            "exp" => Func::Exp,
            _ => return None,
        })
    }

    /// Whether the argument is an angle (`\\sin 30^\\circ` is sin(pi/6)).
    pub fn takes_angle(self) -> bool {
        matches!(
            self,
            Func::Sin | Func::Cos | Func::Tan | Func::Sec | Func::Csc | Func::Cot
        )
    }

    /// The inverse read from `\\sin^{-1}`.
    pub fn inverse(self) -> Option<Func> {
        match self {
            Func::Sin => Some(Func::Asin),
            Func::Cos => Some(Func::Acos),
            Func::Tan => Some(Func::Atan),
            _ => None,
        }
    }

    fn apply(self, x: f64) -> f64 {
        match self {
            Func::Sin => x.sin(),
            Func::Cos => x.cos(),
            Func::Tan => x.tan(),
            Func::Sec => 1.0 / x.cos(),
            Func::Csc => 1.0 / x.sin(),
            Func::Cot => 1.0 / x.tan(),
            Func::Asin => x.asin(),
            Func::Acos => x.acos(),
            Func::Atan => x.atan(),
            Func::Ln => x.ln(),
            Func::Log10 => x.log10(),
            Func::Exp => x.exp(),
            Func::Abs => x.abs(),
        }
    }
}

/// A parsed answer: scalars (possibly symbolic) and the structures built from them.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Num(BigRational),
    Var(String),
    Pi,
    /// Euler's number.
    E,
    /// A clock time `h:mm` in minutes; equal only to the same time.
    Time(u32),
    /// `\\begin{pmatrix}`: rows of entries (every row the same length).
    Matrix(Vec<Vec<Expr>>),
    Infinity,
    Neg(Box<Expr>),
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    Div(Box<Expr>, Box<Expr>),
    Pow(Box<Expr>, Box<Expr>),
    /// `\sqrt[index]{radicand}`; index `None` is 2.
    Root(Box<Expr>, Option<Box<Expr>>),
    Apply(Func, Box<Expr>),
    /// `log_b(x)`.
    LogBase(Box<Expr>, Box<Expr>),
    Factorial(Box<Expr>),
    /// `x\%`: evaluates to x/100; the comparison also accepts it against x.
    Percent(Box<Expr>),
    /// Parenthesized or bracketed list of two or more items: a tuple, point or interval.
    Tuple(Vec<Expr>, Bracket, Bracket),
    /// `\{a, b\}`: an unordered set.
    Set(Vec<Expr>),
    /// A top-level comma list `1, 2` (unordered, like a list of solutions).
    List(Vec<Expr>),
    /// `a = b`, `1 < x < 2`: operands and the operators between them (`ops.len() + 1` operands).
    Relation(Vec<Expr>, Vec<RelOp>),
    /// `A \cup B`.
    Union(Vec<Expr>),
    /// A word answer (`\text{Monday}`, `yes`), lowercased with spaces collapsed.
    Text(String),
}

/// Values bound to variables while evaluating.
pub trait Bindings {
    fn exact(&self, name: &str) -> Option<BigRational>;
    fn approx(&self, name: &str) -> Option<f64>;
}

/// No variables bound.
pub struct NoBindings;

impl Bindings for NoBindings {
    fn exact(&self, _: &str) -> Option<BigRational> {
        None
    }
    fn approx(&self, _: &str) -> Option<f64> {
        None
    }
}

fn bits(value: &BigRational) -> u64 {
    value.numer().bits().max(value.denom().bits())
}

/// Exact integer root of a non-negative rational, when it has one.
fn exact_root(value: &BigRational, index: u32) -> Option<BigRational> {
    if value.is_negative() {
        if index % 2 == 1 {
            return exact_root(&-value, index).map(|root| -root);
        }
        return None;
    }
    let numer_root = value.numer().nth_root(index);
    let denom_root = value.denom().nth_root(index);
    let candidate = BigRational::new(numer_root, denom_root);
    (pow_exact(&candidate, index as i64)? == *value).then_some(candidate)
}

pub(super) fn pow_exact(base: &BigRational, exponent: i64) -> Option<BigRational> {
    if exponent == 0 {
        return Some(BigRational::one());
    }
    if base.is_zero() {
        return (exponent > 0).then(BigRational::zero);
    }
    let magnitude = exponent.unsigned_abs();
    if bits(base).saturating_mul(magnitude) > MAX_EXACT_BITS {
        return None;
    }
    let magnitude = u32::try_from(magnitude).ok()?;
    let numer = num_traits::pow(base.numer().clone(), magnitude as usize);
    let denom = num_traits::pow(base.denom().clone(), magnitude as usize);
    let raised = BigRational::new(numer, denom);
    Some(if exponent < 0 { raised.recip() } else { raised })
}

fn finite_op(a: f64, b: f64, op: fn(f64, f64) -> f64) -> f64 {
    if a.is_infinite() || b.is_infinite() {
        f64::NAN
    } else {
        op(a, b)
    }
}

pub(super) fn checked_result(value: BigRational) -> Option<BigRational> {
    (bits(&value) <= MAX_EXACT_BITS).then_some(value)
}

impl Expr {
    pub fn int(value: i64) -> Expr {
        Expr::Num(BigRational::from_integer(BigInt::from(value)))
    }

    /// True for a bare number literal (possibly negated or a percentage): no operator to
    /// simplify, nothing that could merely restate a question.
    pub fn is_literal(&self) -> bool {
        match self {
            Expr::Num(_) => true,
            Expr::Neg(inner) | Expr::Percent(inner) => inner.is_literal(),
            _ => false,
        }
    }

    /// True when the expression is a scalar (not a tuple, set, list, relation, union or text).
    pub fn is_scalar(&self) -> bool {
        !matches!(
            self,
            Expr::Tuple(..)
                | Expr::Set(_)
                | Expr::List(_)
                | Expr::Relation(..)
                | Expr::Union(_)
                | Expr::Text(_)
                | Expr::Time(_)
                | Expr::Matrix(_)
        )
    }

    /// Collects the names of free variables (deduplicated, in first-seen order).
    pub fn variables(&self, out: &mut Vec<String>) {
        match self {
            Expr::Var(name) => {
                if !out.iter().any(|seen| seen == name) {
                    out.push(name.clone());
                }
            }
            Expr::Num(_) | Expr::Pi | Expr::E | Expr::Time(_) | Expr::Infinity | Expr::Text(_) => {}
            Expr::Matrix(rows) => rows.iter().flatten().for_each(|item| item.variables(out)),
            Expr::Neg(a) | Expr::Apply(_, a) | Expr::Factorial(a) | Expr::Percent(a) => {
                a.variables(out)
            }
            Expr::Root(a, index) => {
                a.variables(out);
                if let Some(index) = index {
                    index.variables(out);
                }
            }
            Expr::Add(a, b)
            | Expr::Sub(a, b)
            | Expr::Mul(a, b)
            | Expr::Div(a, b)
            | Expr::Pow(a, b)
            | Expr::LogBase(a, b) => {
                a.variables(out);
                b.variables(out);
            }
            Expr::Tuple(items, ..)
            | Expr::Set(items)
            | Expr::List(items)
            | Expr::Relation(items, _)
            | Expr::Union(items) => items.iter().for_each(|item| item.variables(out)),
        }
    }

    /// Exact rational value, or `None` when the expression is not rational (or too large, or
    /// not a scalar, or divides by zero).
    pub fn eval_exact(&self, vars: &dyn Bindings) -> Option<BigRational> {
        match self {
            Expr::Num(value) => Some(value.clone()),
            Expr::Var(name) => vars.exact(name),
            Expr::Pi | Expr::E | Expr::Infinity => None,
            Expr::Neg(a) => Some(-a.eval_exact(vars)?),
            Expr::Add(a, b) => checked_result(a.eval_exact(vars)? + b.eval_exact(vars)?),
            Expr::Sub(a, b) => checked_result(a.eval_exact(vars)? - b.eval_exact(vars)?),
            Expr::Mul(..) | Expr::Div(..) if closed_form::pairs_factorials(self) => {
                closed_form::factorial_quotient(self, vars)
            }
            Expr::Mul(a, b) => checked_result(a.eval_exact(vars)? * b.eval_exact(vars)?),
            Expr::Div(a, b) => {
                let denominator = b.eval_exact(vars)?;
                if denominator.is_zero() {
                    return None;
                }
                checked_result(a.eval_exact(vars)? / denominator)
            }
            Expr::Pow(a, b) if **a == Expr::E => closed_form::exp_exact(b, vars),
            Expr::Pow(a, b) => {
                let exponent = b.eval_exact(vars)?;
                let base = a.eval_exact(vars)?;
                if exponent.is_integer() {
                    pow_exact(&base, exponent.to_integer().to_i64()?)
                } else {
                    // a^(p/q) = (q-th root of a)^p, exact only when the root is.
                    let q = exponent.denom().to_u32().filter(|q| *q <= 64)?;
                    let root = exact_root(&base, q)?;
                    pow_exact(&root, exponent.numer().to_i64()?)
                }
            }
            Expr::Root(a, index) => {
                let index = match index {
                    None => 2,
                    Some(index) => {
                        let index = index.eval_exact(vars)?;
                        if !index.is_integer() {
                            return None;
                        }
                        index
                            .to_integer()
                            .to_u32()
                            .filter(|i| (1..=64).contains(i))?
                    }
                };
                exact_root(&a.eval_exact(vars)?, index)
            }
            Expr::Apply(Func::Abs, a) => Some(a.eval_exact(vars)?.abs()),
            Expr::Apply(func, a) => closed_form::apply_exact(*func, a, vars),
            Expr::LogBase(base, a) => closed_form::log_base_exact(base, a, vars),
            Expr::Factorial(a) => closed_form::factorial_value(&a.eval_exact(vars)?),
            Expr::Percent(a) => Some(a.eval_exact(vars)? / BigRational::from_integer(100.into())),
            _ => None,
        }
    }

    /// Floating-point value (NaN when undefined or not a scalar).
    pub fn eval_f64(&self, vars: &dyn Bindings) -> f64 {
        match self {
            Expr::Num(value) => value.to_f64().unwrap_or(f64::NAN),
            Expr::Var(name) => vars.approx(name).unwrap_or(f64::NAN),
            Expr::Pi => std::f64::consts::PI,
            Expr::E => std::f64::consts::E,
            Expr::Infinity => f64::INFINITY,
            Expr::Neg(a) => -a.eval_f64(vars),
            // Arithmetic on infinity (`1^{\infty}`, `\frac{1}{\infty}`) is a limit, not a
            // value: undefined, so it never equals a number.
            Expr::Add(a, b) => finite_op(a.eval_f64(vars), b.eval_f64(vars), |x, y| x + y),
            Expr::Sub(a, b) => finite_op(a.eval_f64(vars), b.eval_f64(vars), |x, y| x - y),
            // A quotient of factorials (`\\frac{(n+1)!}{n!}`) has a value only in pairs.
            Expr::Mul(..) | Expr::Div(..) if closed_form::pairs_factorials(self) => self
                .eval_exact(vars)
                .and_then(|value| value.to_f64())
                .unwrap_or(f64::NAN),
            Expr::Mul(a, b) => finite_op(a.eval_f64(vars), b.eval_f64(vars), |x, y| x * y),
            Expr::Div(a, b) => finite_op(a.eval_f64(vars), b.eval_f64(vars), |x, y| x / y),
            Expr::Pow(a, b) => finite_op(a.eval_f64(vars), b.eval_f64(vars), f64::powf),
            Expr::Root(a, index) => {
                let radicand = a.eval_f64(vars);
                match index {
                    None => radicand.sqrt(),
                    Some(index) => {
                        let index = index.eval_f64(vars);
                        if radicand < 0.0 && index.rem_euclid(2.0) == 1.0 {
                            -(-radicand).powf(1.0 / index)
                        } else {
                            radicand.powf(1.0 / index)
                        }
                    }
                }
            }
            // Exact where the value is rational (`\\sin\\pi` is 0, not 1.2e-16).
            Expr::Apply(func, a) => closed_form::apply_exact(*func, a, vars)
                .and_then(|value| value.to_f64())
                .unwrap_or_else(|| func.apply(a.eval_f64(vars))),
            Expr::LogBase(base, a) => closed_form::log_base_exact(base, a, vars)
                .and_then(|value| value.to_f64())
                .unwrap_or_else(|| a.eval_f64(vars).ln() / base.eval_f64(vars).ln()),
            Expr::Factorial(a) => {
                let n = a.eval_f64(vars);
                if n < 0.0 || n.fract() != 0.0 || n > 170.0 {
                    return f64::NAN;
                }
                (2..=n as u64).fold(1.0, |acc, k| acc * k as f64)
            }
            Expr::Percent(a) => a.eval_f64(vars) / 100.0,
            _ => f64::NAN,
        }
    }
}
