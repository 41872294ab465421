//! A compact, unambiguous text form of a parsed answer (`Expr`), printed by
//! `stoke verify --explain` as the normalized gold and prediction.
//!
//! What this is not: LaTeX output or a simplifier. It shows the tree as parsed, fully
//! parenthesized where precedence could mislead, so a reader sees what was compared.
//!
//! Invariants: printing is linear in the tree's size; the tree's depth is bounded by the parser.

use std::fmt;

use super::expr::{Bracket, Expr, Func, RelOp};

fn join(f: &mut fmt::Formatter<'_>, items: &[Expr], separator: &str) -> fmt::Result {
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            f.write_str(separator)?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}

fn relation(op: RelOp) -> &'static str {
    match op {
        RelOp::Eq => "=",
        RelOp::Less => "<",
        RelOp::LessEq => "<=",
        RelOp::Greater => ">",
        RelOp::GreaterEq => ">=",
        RelOp::NotEq => "!=",
        RelOp::In => "in",
        RelOp::Approx => "~=",
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Num(value) => write!(f, "{value}"),
            Expr::Var(name) => f.write_str(name),
            Expr::Pi => f.write_str("pi"),
            Expr::E => f.write_str("e"),
            Expr::Infinity => f.write_str("inf"),
            Expr::Time(minutes) => write!(f, "{}:{:02} (time)", minutes / 60, minutes % 60),
            Expr::Neg(a) => write!(f, "-({a})"),
            Expr::Add(a, b) => write!(f, "({a} + {b})"),
            Expr::Sub(a, b) => write!(f, "({a} - {b})"),
            Expr::Mul(a, b) => write!(f, "({a} * {b})"),
            Expr::Div(a, b) => write!(f, "({a} / {b})"),
            Expr::Pow(a, b) => write!(f, "({a})^({b})"),
            Expr::Root(a, None) => write!(f, "sqrt({a})"),
            Expr::Root(a, Some(index)) => write!(f, "root[{index}]({a})"),
            Expr::Apply(func, a) => {
                let name = match func {
                    Func::Sin => "sin",
                    Func::Cos => "cos",
                    Func::Tan => "tan",
                    Func::Sec => "sec",
                    Func::Csc => "csc",
                    Func::Cot => "cot",
                    Func::Asin => "asin",
                    Func::Acos => "acos",
                    Func::Atan => "atan",
                    Func::Ln => "ln",
                    Func::Log10 => "log10",
                    Func::Exp => "exp",
                    Func::Abs => "abs",
                };
                write!(f, "{name}({a})")
            }
            Expr::LogBase(base, a) => write!(f, "log_({base})({a})"),
            Expr::Factorial(a) => write!(f, "({a})!"),
            Expr::Percent(a) => write!(f, "{a}%"),
            Expr::Tuple(items, open, close) => {
                f.write_str(if *open == Bracket::Round { "(" } else { "[" })?;
                join(f, items, ", ")?;
                f.write_str(if *close == Bracket::Round { ")" } else { "]" })
            }
            Expr::Set(items) => {
                f.write_str("{")?;
                join(f, items, ", ")?;
                f.write_str("}")
            }
            Expr::List(items) => {
                f.write_str("list[")?;
                join(f, items, ", ")?;
                f.write_str("]")
            }
            Expr::Relation(operands, ops) => {
                for (index, operand) in operands.iter().enumerate() {
                    if index > 0 {
                        write!(f, " {} ", relation(ops[index - 1]))?;
                    }
                    write!(f, "{operand}")?;
                }
                Ok(())
            }
            Expr::Union(items) => join(f, items, " U "),
            Expr::Matrix(rows) => {
                f.write_str("matrix[")?;
                for (index, row) in rows.iter().enumerate() {
                    if index > 0 {
                        f.write_str("; ")?;
                    }
                    join(f, row, ", ")?;
                }
                f.write_str("]")
            }
            Expr::Text(text) => write!(f, "text({text:?})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::math::parser::parse_answer;

    #[test]
    fn normalized_forms_show_the_parse() {
        let show = |text: &str| parse_answer(text).unwrap().to_string();
        assert_eq!(show("\\frac{1}{2}"), "(1 / 2)");
        assert_eq!(show("[0, \\infty)"), "[0, inf)");
        assert_eq!(
            show("\\begin{pmatrix}1 & 2\\\\3 & 4\\end{pmatrix}"),
            "matrix[1, 2; 3, 4]"
        );
        assert_eq!(show("1:15"), "1:15 (time)");
    }
}
