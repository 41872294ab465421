//! Exact values of closed-form functions of numbers, so that `\log_2 8`, `\sin\frac{\pi}{6}`,
//! `\binom{5}{2}` and `\frac{(n+1)!}{n!}` compare exactly with 3, 1/2, 10 and n+1, in both
//! directions (a gold written as `\log_2 8` is rational, so it must accept 3).
//!
//! Rules (each gives a rational or nothing; nothing means "not rational here", and the caller
//! falls back to f64 with the verifier's relative tolerance):
//! - Logarithms: `\log_b x` with rational `b > 0`, `b != 1`, `x > 0` is `p/q` when `b^p = x^q`
//!   exactly, for `q <= MAX_LOG_DENOMINATOR` (`\log_4 8 = 3/2`); `\ln e^r = r`, `\ln 1 = 0`,
//!   `e^{\ln x} = x`. `\log x` without a base is base 10 (the parser's existing convention:
//!   `\log 100` is 2, never `\ln 100`); `\ln` is base e.
//! - Trig functions at rational multiples of pi: by Niven's theorem the only rational values of
//!   sin and cos there are 0, ±1/2 and ±1, of tan and cot 0 and ±1, so these are exact
//!   (`\sin\frac{\pi}{6} = 1/2`, `\cos\pi = -1`, `\tan\frac{\pi}{4} = 1`, `\sin 10^{100}\pi = 0`).
//!   Irrational values (`\sin\frac{\pi}{4}`) have no exact value here and compare in f64 with
//!   surds (`\frac{\sqrt{2}}{2}`). Degrees inside a trig argument are pi/180 (the parser's
//!   reading of `\sin 30^\circ`). `\arcsin 0`, `\arctan 0` and `\arccos 1` are 0.
//! - Factorials in a product or quotient are paired across the fraction bar: `p!/q!` with `p - q`
//!   an integer `d` is `(q+1)...(q+d)` (the identity of the gamma function, exact at any point,
//!   so `\frac{(n+1)!}{n!}` is `n+1` at the non-integer sample points too). A binomial is parsed
//!   as `n!/(k!(n-k)!)`, so `\binom{n}{0} = 1`, `\binom{n}{2} = n(n-1)/2` and `\binom{10^9}{5}` is
//!   five multiplications. An unpaired factorial is exact only at an integer up to
//!   `MAX_FACTORIAL` (`1000000!` is refused, not computed). `compare.rs` pairs factorials across
//!   the two answers too, by evaluating their quotient (`(n+1)!` against `(n+1) n!`).
//!
//! What this is not: a simplifier. Nothing is rewritten; values are computed at one point.
//!
//! Invariants: bounded work whatever the input: a product is flattened to at most
//! `MAX_FACTORS` factors, a factorial pair spans at most `MAX_FACTORIAL` terms, every exact
//! intermediate is limited to `MAX_EXACT_BITS` bits, a logarithm tries at most
//! `MAX_LOG_DENOMINATOR` candidate exponents; a factor is evaluated at most once per pairing
//! candidate (at most `MAX_FACTORS` of them).

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

use super::expr::{Bindings, Expr, Func, MAX_EXACT_BITS, MAX_FACTORIAL, checked_result, pow_exact};

/// Largest denominator of an exact logarithm (`\log_{8} 2 = 1/3`).
pub const MAX_LOG_DENOMINATOR: i64 = 12;
/// Most factors of one product or quotient searched for factorial pairs.
const MAX_FACTORS: usize = 16;

fn int(value: i64) -> BigRational {
    BigRational::from_integer(BigInt::from(value))
}

/// Natural logarithm of a positive big integer, in f64 (also beyond f64's range).
fn ln_big(value: &BigInt) -> f64 {
    let bits = value.bits();
    if bits <= 1000 {
        return value.to_f64().map_or(f64::NAN, f64::ln);
    }
    let shift = bits - 64;
    let top: BigInt = value >> shift;
    top.to_f64().map_or(f64::NAN, f64::ln) + shift as f64 * std::f64::consts::LN_2
}

/// `log_base(value)` when it is rational with a denominator up to `MAX_LOG_DENOMINATOR`.
pub fn log_exact(base: &BigRational, value: &BigRational) -> Option<BigRational> {
    if !base.is_positive() || base.is_one() || !value.is_positive() {
        return None;
    }
    if value.is_one() {
        return Some(BigRational::zero());
    }
    let ln = |x: &BigRational| ln_big(x.numer()) - ln_big(x.denom());
    let estimate = ln(value) / ln(base);
    if !estimate.is_finite() {
        return None;
    }
    // The estimate only proposes exponents; each is verified exactly: base^p == value^q.
    for q in 1..=MAX_LOG_DENOMINATOR {
        let p = (estimate * q as f64).round();
        if p.abs() > (MAX_EXACT_BITS as f64) || p == 0.0 {
            continue;
        }
        let p = p as i64;
        if let (Some(left), Some(right)) = (pow_exact(base, p), pow_exact(value, q))
            && left == right
        {
            return Some(BigRational::new(p.into(), q.into()));
        }
    }
    None
}

/// `e^x` when it is rational: `e^0 = 1`, `e^{\ln y} = y`.
pub fn exp_exact(exponent: &Expr, vars: &dyn Bindings) -> Option<BigRational> {
    match exponent {
        Expr::Apply(Func::Ln, inner) => inner.eval_exact(vars).filter(|v| v.is_positive()),
        Expr::LogBase(base, inner) if **base == Expr::E => {
            inner.eval_exact(vars).filter(|v| v.is_positive())
        }
        other => other
            .eval_exact(vars)
            .filter(|v| v.is_zero())
            .map(|_| BigRational::one()),
    }
}

/// `\ln x` when it is rational: `\ln e^r = r`, `\ln e = 1`, `\ln 1 = 0`.
fn ln_exact(argument: &Expr, vars: &dyn Bindings) -> Option<BigRational> {
    match argument {
        Expr::E => Some(BigRational::one()),
        Expr::Pow(base, exponent) if **base == Expr::E => exponent.eval_exact(vars),
        Expr::Apply(Func::Exp, exponent) => exponent.eval_exact(vars),
        other => other
            .eval_exact(vars)
            .filter(|v| v.is_one())
            .map(|_| BigRational::zero()),
    }
}

/// `\log_b x` when it is rational.
pub fn log_base_exact(base: &Expr, argument: &Expr, vars: &dyn Bindings) -> Option<BigRational> {
    if *base == Expr::E {
        return ln_exact(argument, vars);
    }
    log_exact(&base.eval_exact(vars)?, &argument.eval_exact(vars)?)
}

/// `a + b pi` with rational `a`, `b`, when `expr` has that form.
fn pi_affine(expr: &Expr, vars: &dyn Bindings) -> Option<(BigRational, BigRational)> {
    match expr {
        Expr::Pi => Some((BigRational::zero(), BigRational::one())),
        Expr::Neg(a) => pi_affine(a, vars).map(|(x, y)| (-x, -y)),
        Expr::Add(a, b) | Expr::Sub(a, b) => {
            let ((ax, ay), (bx, by)) = (pi_affine(a, vars)?, pi_affine(b, vars)?);
            Some(if matches!(expr, Expr::Add(..)) {
                (checked_result(ax + bx)?, checked_result(ay + by)?)
            } else {
                (checked_result(ax - bx)?, checked_result(ay - by)?)
            })
        }
        Expr::Mul(a, b) => {
            let ((ax, ay), (bx, by)) = (pi_affine(a, vars)?, pi_affine(b, vars)?);
            // (pi)(pi) is not affine in pi.
            if !ay.is_zero() && !by.is_zero() {
                return None;
            }
            let x = checked_result(&ax * &bx)?;
            let y = checked_result(ax * by + ay * bx)?;
            Some((x, y))
        }
        Expr::Div(a, b) => {
            let ((ax, ay), (bx, by)) = (pi_affine(a, vars)?, pi_affine(b, vars)?);
            if !by.is_zero() || bx.is_zero() {
                return None;
            }
            Some((checked_result(ax / &bx)?, checked_result(ay / bx)?))
        }
        other => Some((other.eval_exact(vars)?, BigRational::zero())),
    }
}

/// The angle `expr` as a multiple of pi/12 in `0..24`, when it is one (zero included).
fn twelfths_of_pi(expr: &Expr, vars: &dyn Bindings) -> Option<i64> {
    let (constant, multiple) = pi_affine(expr, vars)?;
    if !constant.is_zero() {
        // sin, cos and tan of a non-zero rational are transcendental.
        return None;
    }
    let twelfths = multiple * int(12);
    if !twelfths.is_integer() {
        return None;
    }
    let period = BigInt::from(24);
    (((twelfths.to_integer() % &period) + &period) % &period).to_i64()
}

/// sin(k pi/12) for k in 0..24, when rational.
fn sin_twelfths(k: i64) -> Option<BigRational> {
    Some(match k {
        0 | 12 => BigRational::zero(),
        2 | 10 => BigRational::new(1.into(), 2.into()),
        6 => BigRational::one(),
        14 | 22 => BigRational::new((-1).into(), 2.into()),
        18 => -BigRational::one(),
        _ => return None,
    })
}

/// tan(k pi/12) when rational and defined.
fn tan_twelfths(k: i64) -> Option<BigRational> {
    Some(match k % 12 {
        0 => BigRational::zero(),
        3 => BigRational::one(),
        9 => -BigRational::one(),
        _ => return None,
    })
}

fn reciprocal(value: BigRational) -> Option<BigRational> {
    (!value.is_zero()).then(|| value.recip())
}

/// A function of a number, when its value is rational.
pub fn apply_exact(func: Func, argument: &Expr, vars: &dyn Bindings) -> Option<BigRational> {
    let angle = || twelfths_of_pi(argument, vars);
    let zero_argument = || argument.eval_exact(vars).is_some_and(|v| v.is_zero());
    match func {
        Func::Abs => Some(argument.eval_exact(vars)?.abs()),
        Func::Sin => sin_twelfths(angle()?),
        Func::Cos => sin_twelfths((angle()? + 6) % 24),
        Func::Tan => tan_twelfths(angle()?),
        // cot x = -tan(x + pi/2).
        Func::Cot => tan_twelfths((angle()? + 6) % 24).map(|value| -value),
        Func::Sec => reciprocal(sin_twelfths((angle()? + 6) % 24)?),
        Func::Csc => reciprocal(sin_twelfths(angle()?)?),
        Func::Asin | Func::Atan => zero_argument().then(BigRational::zero),
        Func::Acos => argument
            .eval_exact(vars)
            .filter(|v| v.is_one())
            .map(|_| BigRational::zero()),
        Func::Ln => ln_exact(argument, vars),
        Func::Log10 => log_exact(&int(10), &argument.eval_exact(vars)?),
        Func::Exp => exp_exact(argument, vars),
    }
}

/// The factors of a product or quotient: numerator and denominator, at most `MAX_FACTORS`.
#[derive(Default)]
struct Factors<'e> {
    numer: Vec<&'e Expr>,
    denom: Vec<&'e Expr>,
}

fn collect<'e>(expr: &'e Expr, inverted: bool, out: &mut Factors<'e>) -> Option<()> {
    match expr {
        Expr::Mul(a, b) => {
            collect(a, inverted, out)?;
            collect(b, inverted, out)
        }
        Expr::Div(a, b) => {
            collect(a, inverted, out)?;
            collect(b, !inverted, out)
        }
        factor => {
            if out.numer.len() + out.denom.len() >= MAX_FACTORS {
                return None;
            }
            if inverted {
                out.denom.push(factor);
            } else {
                out.numer.push(factor);
            }
            Some(())
        }
    }
}

fn factors(expr: &Expr) -> Option<Factors<'_>> {
    let mut out = Factors::default();
    collect(expr, false, &mut out)?;
    Some(out)
}

fn factorial_argument(expr: &Expr) -> Option<&Expr> {
    match expr {
        Expr::Factorial(inner) => Some(inner),
        _ => None,
    }
}

/// Whether `expr` is a product or quotient with a factorial on each side of the fraction bar
/// (so it is evaluated by `factorial_quotient`).
pub fn pairs_factorials(expr: &Expr) -> bool {
    if !matches!(expr, Expr::Div(..) | Expr::Mul(..)) {
        return false;
    }
    factors(expr).is_some_and(|f| {
        f.numer.iter().any(|e| factorial_argument(e).is_some())
            && f.denom.iter().any(|e| factorial_argument(e).is_some())
    })
}

/// A factorial's argument at this point, when the factorial is defined (not a negative
/// integer).
fn defined_argument(expr: &Expr, vars: &dyn Bindings) -> Option<BigRational> {
    let value = expr.eval_exact(vars)?;
    (!(value.is_integer() && value.is_negative())).then_some(value)
}

/// `n!` for an integer `0 <= n <= MAX_FACTORIAL`; `None` otherwise (refused, not computed).
pub fn factorial_value(n: &BigRational) -> Option<BigRational> {
    if !n.is_integer() || n.is_negative() {
        return None;
    }
    let n = n.to_integer().to_u64().filter(|n| *n <= MAX_FACTORIAL)?;
    let product = (2..=n).fold(BigInt::one(), |acc, k| acc * BigInt::from(k));
    Some(BigRational::from_integer(product))
}

/// `(from+1)(from+2)...(from+count)`.
fn rising(from: &BigRational, count: u64) -> Option<BigRational> {
    let mut product = BigRational::one();
    for step in 1..=count {
        product = checked_result(product * (from + BigRational::from_integer(step.into())))?;
    }
    Some(product)
}

/// A factor evaluated once: its value, or for a factorial the value of its argument.
enum FactorValue {
    Plain(BigRational),
    Factorial(BigRational),
}

fn factor_value(factor: &Expr, vars: &dyn Bindings) -> Option<FactorValue> {
    Some(match factorial_argument(factor) {
        Some(argument) => FactorValue::Factorial(defined_argument(argument, vars)?),
        None => FactorValue::Plain(factor.eval_exact(vars)?),
    })
}

/// The unpaired factor's value.
fn unpaired(value: &FactorValue) -> Option<BigRational> {
    match value {
        FactorValue::Plain(value) => Some(value.clone()),
        FactorValue::Factorial(argument) => factorial_value(argument),
    }
}

/// A product or quotient of factorials and other factors, with factorials paired across the
/// fraction bar (see the module doc). Every factor is evaluated once.
pub fn factorial_quotient(expr: &Expr, vars: &dyn Bindings) -> Option<BigRational> {
    let factors = factors(expr)?;
    let evaluate = |list: &[&Expr]| -> Option<Vec<FactorValue>> {
        list.iter()
            .map(|factor| factor_value(factor, vars))
            .collect()
    };
    let (numer, denom) = (evaluate(&factors.numer)?, evaluate(&factors.denom)?);
    let mut paired = vec![false; denom.len()];
    let mut result = BigRational::one();
    for value in &numer {
        let FactorValue::Factorial(p) = value else {
            result = checked_result(result * unpaired(value)?)?;
            continue;
        };
        // The denominator factorial closest to this one, an integer number of steps away.
        let partner = denom
            .iter()
            .enumerate()
            .filter(|(index, _)| !paired[*index])
            .filter_map(|(index, value)| {
                let FactorValue::Factorial(q) = value else {
                    return None;
                };
                let steps = p - q;
                if !steps.is_integer() {
                    return None;
                }
                let steps = steps.to_integer().to_i64()?;
                (steps.unsigned_abs() <= MAX_FACTORIAL).then_some((index, q, steps))
            })
            .min_by_key(|(_, _, steps)| steps.unsigned_abs());
        result = match partner {
            Some((index, q, steps)) => {
                paired[index] = true;
                if steps >= 0 {
                    checked_result(result * rising(q, steps.unsigned_abs())?)?
                } else {
                    checked_result(result / rising(p, steps.unsigned_abs())?)?
                }
            }
            None => checked_result(result * factorial_value(p)?)?,
        };
    }
    let mut divisor = BigRational::one();
    for (index, value) in denom.iter().enumerate() {
        if !paired[index] {
            divisor = checked_result(divisor * unpaired(value)?)?;
        }
    }
    if divisor.is_zero() {
        return None;
    }
    checked_result(result / divisor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::expr::NoBindings;
    use crate::math::parser::parse_answer;

    fn exact(text: &str) -> Option<BigRational> {
        parse_answer(text).ok()?.eval_exact(&NoBindings)
    }

    fn ratio(n: i64, d: i64) -> Option<BigRational> {
        Some(BigRational::new(n.into(), d.into()))
    }

    #[test]
    fn logarithms_are_exact_when_rational() {
        assert_eq!(exact("\\log_2 8"), ratio(3, 1));
        assert_eq!(exact("\\log_{10} 1000"), ratio(3, 1));
        assert_eq!(exact("\\log_4 8"), ratio(3, 2));
        assert_eq!(exact("\\log_8 2"), ratio(1, 3));
        assert_eq!(exact("\\log_2 \\frac{1}{8}"), ratio(-3, 1));
        assert_eq!(exact("\\log 100"), ratio(2, 1));
        assert_eq!(exact("\\ln e"), ratio(1, 1));
        assert_eq!(exact("\\ln e^{3}"), ratio(3, 1));
        assert_eq!(exact("\\ln 1"), ratio(0, 1));
        assert_eq!(exact("e^{\\ln 5}"), ratio(5, 1));
        assert_eq!(exact("\\log_2 3"), None);
        assert_eq!(exact("\\log_1 1"), None);
        assert_eq!(exact("\\log_2 0"), None);
    }

    #[test]
    fn trig_at_rational_multiples_of_pi_is_exact_when_rational() {
        assert_eq!(exact("\\sin\\frac{\\pi}{6}"), ratio(1, 2));
        assert_eq!(exact("\\sin\\frac{\\pi}{2}"), ratio(1, 1));
        assert_eq!(exact("\\cos\\pi"), ratio(-1, 1));
        assert_eq!(exact("\\cos\\frac{2\\pi}{3}"), ratio(-1, 2));
        assert_eq!(exact("\\tan\\frac{\\pi}{4}"), ratio(1, 1));
        assert_eq!(exact("\\tan\\frac{3\\pi}{4}"), ratio(-1, 1));
        assert_eq!(exact("\\cot\\frac{\\pi}{2}"), ratio(0, 1));
        assert_eq!(exact("\\sec\\frac{\\pi}{3}"), ratio(2, 1));
        assert_eq!(exact("\\sin(10^{100}\\pi)"), ratio(0, 1));
        assert_eq!(exact("\\sin 0"), ratio(0, 1));
        assert_eq!(exact("\\sin 30^\\circ"), ratio(1, 2));
        assert_eq!(exact("\\sin\\frac{\\pi}{4}"), None);
        assert_eq!(exact("\\sin\\frac{\\pi}{3}"), None);
        assert_eq!(exact("\\tan\\frac{\\pi}{2}"), None);
        assert_eq!(exact("\\sin 1"), None);
    }

    #[test]
    fn factorials_pair_across_the_fraction_bar() {
        assert_eq!(exact("\\binom{5}{2}"), ratio(10, 1));
        assert_eq!(exact("\\frac{7!}{5!}"), ratio(42, 1));
        assert_eq!(exact("\\frac{5!}{7!}"), ratio(1, 42));
        assert_eq!(
            exact("\\binom{10^{9}}{2}"),
            ratio(499_999_999_500_000_000, 1)
        );
        assert_eq!(exact("1000000!"), None);
        assert_eq!(exact("\\binom{10^{9}}{10^{8}}"), None);
        assert_eq!(exact("\\frac{(-1)!}{(-2)!}"), None);
    }
}
