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

/// Normal(`mean`, `std`) values of `shape` in `T`'s dtype, like `Tensor::randn`, but from a
/// generator seeded the same way on every thread: each test runs on a thread of its own, so a
/// test sees the same inputs on every run. (Unseeded `randn` made the finite-difference tests
/// fail now and then, whenever a gradient happened to fall into the difference noise.)
pub fn seeded_randn<T: candle_core::WithDType>(
    mean: T,
    std: T,
    shape: impl Into<candle_core::Shape>,
    device: &candle_core::Device,
) -> candle_core::Result<candle_core::Tensor> {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = const { Cell::new(0x5EED_0019) };
    }
    // splitmix64, then Box-Muller.
    let next = || {
        STATE.with(|s| {
            let z = s.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
            s.set(z);
            let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        })
    };
    let shape = shape.into();
    let (mean, std) = (mean.to_f64(), std.to_f64());
    let values: Vec<T> = (0..shape.elem_count())
        .map(|_| {
            let (u1, u2) = (next().max(f64::MIN_POSITIVE), next());
            let normal = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            T::from_f64(mean + std * normal)
        })
        .collect();
    candle_core::Tensor::from_vec(values, shape, device)
}
