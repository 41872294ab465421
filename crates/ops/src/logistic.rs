//! The logistic family with exact values and exact gradients everywhere, for the preference
//! losses: `log_sigmoid(x) = -log(1 + exp(-x))`, `sigmoid(x)` and `log1mexp(x) = log(1 - exp(x))`
//! (x < 0, ORPO's log-odds).
//!
//! Why custom ops: the stable compositions of candle ops (`-relu(-x) - log(1 + exp(-|x|))`) have
//! the wrong gradient at `x = 0`, because candle's `relu` and `abs` backward give 0 there. DPO's
//! first step has exactly `x = 0` (policy = reference, so every log-ratio is 0); the composed
//! gradient would be 0 and the model would never move. These ops compute in f64 (`ln_1p`,
//! `exp_m1`) whatever the input dtype and carry closed-form derivatives:
//! `d log_sigmoid / dx = sigmoid(-x)`, `d sigmoid / dx = s (1 - s)`,
//! `d log1mexp / dx = -1 / expm1(-x)`.
//!
//! What this is not: not a fast kernel. The losses apply them to one value per sequence.

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

use crate::kernels::contiguous_slice;

/// `log(sigmoid(x))`, elementwise, accurate for large |x| of either sign.
pub fn log_sigmoid(x: &Tensor) -> Result<Tensor> {
    apply(x, Logistic::LogSigmoid)
}

/// `1 / (1 + exp(-x))`, elementwise.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    apply(x, Logistic::Sigmoid)
}

/// `log(1 - exp(x))` for `x < 0`, elementwise (NaN for `x >= 0`, where it is undefined; -inf
/// at `x = 0`). Uses `log(-expm1(x))` near 0 and `ln_1p(-exp(x))` below `-ln 2` (Mächler 2012).
pub fn log1mexp(x: &Tensor) -> Result<Tensor> {
    apply(x, Logistic::Log1mexp)
}

fn apply(x: &Tensor, op: Logistic) -> Result<Tensor> {
    if !x.device().is_cpu() {
        candle_core::bail!("{}: only the CPU is supported", op.name());
    }
    x.contiguous()?.apply_op1(op)
}

#[derive(Clone, Copy, Debug)]
enum Logistic {
    LogSigmoid,
    Sigmoid,
    Log1mexp,
    /// The derivative of `Log1mexp`: `-1 / expm1(-x)` (used by its backward).
    Log1mexpGrad,
}

fn log_sigmoid_f64(x: f64) -> f64 {
    if x >= 0.0 {
        -(-x).exp().ln_1p()
    } else {
        x - x.exp().ln_1p()
    }
}

fn sigmoid_f64(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn log1mexp_f64(x: f64) -> f64 {
    if x > -std::f64::consts::LN_2 {
        (-x.exp_m1()).ln()
    } else {
        (-x.exp()).ln_1p()
    }
}

impl Logistic {
    fn name(self) -> &'static str {
        match self {
            Logistic::LogSigmoid => "stoke-log-sigmoid",
            Logistic::Sigmoid => "stoke-sigmoid",
            Logistic::Log1mexp => "stoke-log1mexp",
            Logistic::Log1mexpGrad => "stoke-log1mexp-grad",
        }
    }

    fn eval(self, x: f64) -> f64 {
        match self {
            Logistic::LogSigmoid => log_sigmoid_f64(x),
            Logistic::Sigmoid => sigmoid_f64(x),
            Logistic::Log1mexp => log1mexp_f64(x),
            Logistic::Log1mexpGrad => -1.0 / (-x).exp_m1(),
        }
    }
}

impl CustomOp1 for Logistic {
    fn name(&self) -> &'static str {
        Logistic::name(*self)
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = match storage {
            CpuStorage::F32(data) => CpuStorage::F32(
                contiguous_slice(data, layout, self.name())?
                    .iter()
                    .map(|&v| self.eval(f64::from(v)) as f32)
                    .collect(),
            ),
            CpuStorage::F64(data) => CpuStorage::F64(
                contiguous_slice(data, layout, self.name())?
                    .iter()
                    .map(|&v| self.eval(v))
                    .collect(),
            ),
            _ => candle_core::bail!("{}: only f32 and f64 are supported", self.name()),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let local = match self {
            Logistic::LogSigmoid => sigmoid(&arg.neg()?)?,
            Logistic::Sigmoid => (res * (1.0 - res)?)?,
            Logistic::Log1mexp => apply(arg, Logistic::Log1mexpGrad)?,
            Logistic::Log1mexpGrad => {
                candle_core::bail!("{}: no second derivative", self.name())
            }
        };
        Ok(Some((grad_res * local)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn grad_of(f: impl Fn(&Tensor) -> Result<Tensor>, xs: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let x = Var::from_slice(xs, xs.len(), &Device::Cpu).unwrap();
        let y = f(x.as_tensor()).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        (
            y.to_vec1().unwrap(),
            grads.get(x.as_tensor()).unwrap().to_vec1().unwrap(),
        )
    }

    #[test]
    fn log_sigmoid_values_and_gradient_including_zero() {
        let xs = [-800.0, -30.0, -1.5, 0.0, 1e-9, 2.0, 40.0, 800.0];
        let (y, g) = grad_of(log_sigmoid, &xs);
        for ((&x, &y), &g) in xs.iter().zip(&y).zip(&g) {
            let expect = -(1.0 + (-x).exp()).ln();
            let tol = 1e-15 * expect.abs().max(1.0);
            if x.abs() < 700.0 {
                assert!(
                    (y - expect).abs() <= tol,
                    "log_sigmoid({x}) = {y}, want {expect}"
                );
            }
            assert!(y.is_finite(), "log_sigmoid({x}) = {y}");
            let want_g = 1.0 / (1.0 + x.exp());
            assert!((g - want_g).abs() <= 1e-15, "d/dx at {x}: {g} vs {want_g}");
        }
        // The case the custom op exists for: the gradient at 0 is 1/2, not 0.
        assert_eq!(g[3], 0.5);
        assert_eq!(y[0], -800.0);
    }

    #[test]
    fn sigmoid_values_and_gradient() {
        let xs = [-50.0, -2.0, 0.0, 3.0, 50.0];
        let (y, g) = grad_of(sigmoid, &xs);
        for ((&x, &y), &g) in xs.iter().zip(&y).zip(&g) {
            let s = 1.0 / (1.0 + (-x).exp());
            assert!((y - s).abs() <= 1e-16 + 1e-15 * s, "sigmoid({x})");
            assert!((g - s * (1.0 - s)).abs() <= 1e-16, "sigmoid'({x})");
        }
        assert_eq!(g[2], 0.25);
    }

    #[test]
    fn log1mexp_is_accurate_near_zero_and_far_below() {
        let xs = [-1e-10, -0.01, -0.5, -std::f64::consts::LN_2, -3.0, -40.0];
        let (y, g) = grad_of(log1mexp, &xs);
        for ((&x, &y), &g) in xs.iter().zip(&y).zip(&g) {
            // Reference in f64 from the series where the direct formula is exact enough.
            let expect = (1.0 - x.exp()).ln();
            let tol = if x > -1e-6 { 1e-6 } else { 1e-13 } * expect.abs().max(1.0);
            assert!(
                (y - expect).abs() <= tol,
                "log1mexp({x}) = {y}, want {expect}"
            );
            let want_g = -x.exp() / (1.0 - x.exp());
            let gtol = if x > -1e-6 { 1e-4 } else { 1e-12 } * want_g.abs().max(1.0);
            assert!((g - want_g).abs() <= gtol, "d/dx at {x}: {g} vs {want_g}");
        }
        // Near zero: log(1 - e^x) ~ log(-x).
        assert!((y[0] - (1e-10f64).ln()).abs() < 1e-9);
    }

    #[test]
    fn f32_inputs_compute_in_f64() {
        let x = Tensor::new(&[-100.0f32, 0.0, 200.0], &Device::Cpu).unwrap();
        let y: Vec<f32> = log_sigmoid(&x).unwrap().to_vec1().unwrap();
        assert_eq!(y, vec![-100.0, -std::f32::consts::LN_2, 0.0]);
        let bf16 = x.to_dtype(candle_core::DType::BF16).unwrap();
        assert!(log_sigmoid(&bf16).is_err());
    }
}
