//! Finite-difference gradient checking, used by the tests of this crate and of stoke-model.
//!
//! What it is: compares candle's backward gradients of a scalar function of some `Var`s with
//! central differences `(f(x+h) - f(x-h)) / 2h` on chosen coordinates. Run it in f64 so the
//! difference quotient is accurate; candle's CPU backend supports f64 for every operation
//! used here. What it is not: a proof of correctness for all coordinates (it samples), nor
//! fast (two extra forward passes per coordinate).

use candle_core::{DType, Result, Tensor, Var};

/// One checked coordinate: parameter index, flat element index, analytic and numeric values.
#[derive(Debug, Clone, PartialEq)]
pub struct GradCheckPoint {
    pub var_index: usize,
    pub flat_index: usize,
    pub analytic: f64,
    pub numeric: f64,
}

impl GradCheckPoint {
    /// `|analytic - numeric| / max(|analytic|, |numeric|, floor)`; the floor keeps coordinates
    /// whose true gradient is ~0 from producing huge relative errors out of rounding noise.
    pub fn relative_error(&self, floor: f64) -> f64 {
        let scale = self.analytic.abs().max(self.numeric.abs()).max(floor);
        (self.analytic - self.numeric).abs() / scale
    }
}

/// Checks `loss_fn` (must return a scalar tensor) at the given `(var_index, flat_index)`
/// coordinates with step `step`. Restores every perturbed variable before returning.
pub fn check_gradients(
    vars: &[Var],
    loss_fn: &dyn Fn(&[Var]) -> Result<Tensor>,
    coordinates: &[(usize, usize)],
    step: f64,
) -> Result<Vec<GradCheckPoint>> {
    let loss = loss_fn(vars)?;
    let grads = loss.backward()?;
    let mut points = Vec::with_capacity(coordinates.len());
    for &(var_index, flat_index) in coordinates {
        let var = &vars[var_index];
        let analytic = match grads.get(var.as_tensor()) {
            Some(grad) => flat_value(grad, flat_index)?,
            None => 0.0,
        };
        let original = var.as_tensor().copy()?;
        let shape = original.shape().clone();
        let mut values: Vec<f64> = original.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?;
        let center = values[flat_index];
        values[flat_index] = center + step;
        var.set(
            &Tensor::from_vec(values.clone(), &shape, original.device())?
                .to_dtype(original.dtype())?,
        )?;
        let plus = scalar(&loss_fn(vars)?)?;
        values[flat_index] = center - step;
        var.set(&Tensor::from_vec(values, &shape, original.device())?.to_dtype(original.dtype())?)?;
        let minus = scalar(&loss_fn(vars)?)?;
        var.set(&original)?;
        points.push(GradCheckPoint {
            var_index,
            flat_index,
            analytic,
            numeric: (plus - minus) / (2.0 * step),
        });
    }
    Ok(points)
}

fn flat_value(t: &Tensor, index: usize) -> Result<f64> {
    t.flatten_all()?
        .get(index)?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()
}

fn scalar(t: &Tensor) -> Result<f64> {
    t.to_dtype(DType::F64)?
        .flatten_all()?
        .get(0)?
        .to_scalar::<f64>()
}
