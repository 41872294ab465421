//! Matrices as values: `\begin{pmatrix}` literals and the arithmetic written around them
//! (sums, differences, scalar multiples and products), reduced to rows of entry expressions.
//!
//! What this is not: linear algebra beyond that (no inverses, determinants or powers). An
//! expression it cannot reduce is compared as written, so never equal to a matrix.
//!
//! Invariants: shapes are checked at every step (a 1x4 row is never a 2x2 matrix); products
//! are limited to `MAX_SIDE` rows and columns, so the entry expressions stay small.

use super::expr::Expr;

/// Largest number of rows or columns multiplied.
const MAX_SIDE: usize = 8;

pub type Rows = Vec<Vec<Expr>>;

fn shape(rows: &Rows) -> (usize, usize) {
    (rows.len(), rows.first().map_or(0, Vec::len))
}

/// Whether `expr` is built from matrices (so it must reduce to one to be compared).
pub fn involves_matrix(expr: &Expr) -> bool {
    match expr {
        Expr::Matrix(_) => true,
        Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Div(a, b) => {
            involves_matrix(a) || involves_matrix(b)
        }
        Expr::Neg(a) => involves_matrix(a),
        _ => false,
    }
}

fn entrywise(a: Rows, b: Rows, op: fn(Box<Expr>, Box<Expr>) -> Expr) -> Option<Rows> {
    (shape(&a) == shape(&b)).then(|| {
        a.into_iter()
            .zip(b)
            .map(|(ra, rb)| {
                ra.into_iter()
                    .zip(rb)
                    .map(|(x, y)| op(Box::new(x), Box::new(y)))
                    .collect()
            })
            .collect()
    })
}

fn scaled(rows: Rows, factor: &Expr) -> Rows {
    rows.into_iter()
        .map(|row| {
            row.into_iter()
                .map(|x| Expr::Mul(Box::new(factor.clone()), Box::new(x)))
                .collect()
        })
        .collect()
}

fn product(a: &Rows, b: &Rows) -> Option<Rows> {
    let ((n, inner), (inner_b, m)) = (shape(a), shape(b));
    if inner != inner_b || n > MAX_SIDE || m > MAX_SIDE || inner > MAX_SIDE {
        return None;
    }
    Some(
        (0..n)
            .map(|i| {
                (0..m)
                    .map(|j| {
                        (0..inner)
                            .map(|k| {
                                Expr::Mul(Box::new(a[i][k].clone()), Box::new(b[k][j].clone()))
                            })
                            .reduce(|sum, term| Expr::Add(Box::new(sum), Box::new(term)))
                            .unwrap_or_else(|| Expr::int(0))
                    })
                    .collect()
            })
            .collect(),
    )
}

/// The rows `expr` evaluates to, when it is matrix arithmetic this module can reduce.
pub fn reduce(expr: &Expr) -> Option<Rows> {
    match expr {
        Expr::Matrix(rows) => Some(rows.clone()),
        Expr::Add(a, b) => entrywise(reduce(a)?, reduce(b)?, Expr::Add),
        Expr::Sub(a, b) => entrywise(reduce(a)?, reduce(b)?, Expr::Sub),
        Expr::Neg(a) => Some(scaled(reduce(a)?, &Expr::int(-1))),
        Expr::Mul(a, b) => match (involves_matrix(a), involves_matrix(b)) {
            (true, true) => product(&reduce(a)?, &reduce(b)?),
            (false, true) => Some(scaled(reduce(b)?, a)),
            (true, false) => Some(scaled(reduce(a)?, b)),
            (false, false) => None,
        },
        Expr::Div(a, b) if !involves_matrix(b) => {
            let reciprocal = Expr::Div(Box::new(Expr::int(1)), b.clone());
            Some(scaled(reduce(a)?, &reciprocal))
        }
        _ => None,
    }
}

/// A vector's entries: a one-column or one-row matrix.
pub fn vector_entries(rows: &Rows) -> Option<Vec<&Expr>> {
    match shape(rows) {
        (_, 1) => Some(rows.iter().map(|row| &row[0]).collect()),
        (1, _) => Some(rows[0].iter().collect()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::parser::parse_answer;

    #[test]
    fn sums_and_products_reduce_and_shapes_are_kept() {
        let sum = parse_answer(
            "\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix} + \\begin{pmatrix}5 & 6 \\\\ 7 & 8\\end{pmatrix}",
        )
        .unwrap();
        assert_eq!(shape(&reduce(&sum).unwrap()), (2, 2));
        let row = parse_answer("\\begin{pmatrix}1 & 2 & 3 & 4\\end{pmatrix}").unwrap();
        assert_eq!(shape(&reduce(&row).unwrap()), (1, 4));
        let mismatched =
            parse_answer("\\begin{pmatrix}1 & 2\\end{pmatrix} \\begin{pmatrix}1 & 2\\end{pmatrix}")
                .unwrap();
        assert_eq!(reduce(&mismatched), None);
    }
}
