//! SwiGLU, the gated MLP activation of Llama/Qwen: `silu(gate) * up`, with
//! `silu(x) = x * sigmoid(x)`. candle's `silu` unary op has a backward rule.

use candle_core::{Result, Tensor};

/// Elementwise `silu(gate) * up`; both inputs have the same shape.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::{Device, Var};

    #[test]
    fn matches_a_scalar_reference() -> Result<()> {
        let dev = Device::Cpu;
        let gate = [-3.0f64, -0.5, 0.0, 0.7, 5.0];
        let up = [1.0f64, 2.0, -1.0, 0.5, -2.0];
        let out = swiglu(&Tensor::new(&gate, &dev)?, &Tensor::new(&up, &dev)?)?.to_vec1::<f64>()?;
        for i in 0..5 {
            let expected = gate[i] / (1.0 + (-gate[i]).exp()) * up[i];
            assert!((out[i] - expected).abs() < 1e-12);
        }
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let gate = Var::from_tensor(&Tensor::randn(0f64, 2.0, (4, 5), &dev)?)?;
        let up = Var::from_tensor(&Tensor::randn(0f64, 1.0, (4, 5), &dev)?)?;
        let probe = Tensor::randn(0f64, 1.0, (4, 5), &dev)?;
        let loss = |v: &[Var]| {
            swiglu(v[0].as_tensor(), v[1].as_tensor())?
                .mul(&probe)?
                .sum_all()
        };
        let coords = [(0, 0), (0, 9), (0, 19), (1, 3), (1, 17)];
        for p in check_gradients(&[gate, up], &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "{p:?}");
        }
        Ok(())
    }
}
