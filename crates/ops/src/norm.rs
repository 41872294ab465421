//! RMSNorm as transformers computes it: `weight * (x * rsqrt(mean(x^2, -1) + eps))`, with the
//! normalisation done in f32 for half-precision inputs and the result cast back before the
//! weight multiply (LlamaRMSNorm.forward). f32/f64 CPU inputs use the fused kernel with
//! closed-form backward (kernels.rs); other dtypes/devices use a differentiable composition.

use candle_core::{D, DType, Result, Tensor};

/// Normalises over the last dimension. `weight` has the size of that dimension.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let fused_ok = x.device().is_cpu()
        && matches!(x.dtype(), DType::F32 | DType::F64)
        && weight.dtype() == x.dtype();
    if fused_ok {
        return crate::kernels::rms_norm_fused(x, weight, eps);
    }
    let input_dtype = x.dtype();
    let compute_dtype = match input_dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    };
    let x = x.to_dtype(compute_dtype)?;
    let mean_square = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv_rms = (mean_square + eps)?.sqrt()?.recip()?;
    let normed = x.broadcast_mul(&inv_rms)?.to_dtype(input_dtype)?;
    normed.broadcast_mul(weight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::{Device, Var};

    #[test]
    fn matches_a_scalar_reference() -> Result<()> {
        let x = vec![1.0f32, -2.0, 3.0, 0.5, 0.0, 4.0];
        let w = vec![0.5f32, 1.0, 2.0];
        let out = rms_norm(
            &Tensor::from_vec(x.clone(), (2, 3), &Device::Cpu)?,
            &Tensor::new(w.as_slice(), &Device::Cpu)?,
            1e-6,
        )?
        .flatten_all()?
        .to_vec1::<f32>()?;
        for row in 0..2 {
            let xs = &x[row * 3..row * 3 + 3];
            let ms = xs.iter().map(|v| v * v).sum::<f32>() / 3.0;
            for c in 0..3 {
                let expected = w[c] * xs[c] / (ms + 1e-6).sqrt();
                assert!((out[row * 3 + c] - expected).abs() < 1e-6);
            }
        }
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&crate::gradcheck::seeded_randn(0f64, 1.0, (2, 3, 5), &dev)?)?;
        let w = Var::from_tensor(&crate::gradcheck::seeded_randn(1f64, 0.3, 5, &dev)?)?;
        let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (2, 3, 5), &dev)?;
        let loss = |v: &[Var]| {
            rms_norm(v[0].as_tensor(), v[1].as_tensor(), 1e-5)?
                .mul(&probe)?
                .sum_all()
        };
        let coords = [(0, 0), (0, 7), (0, 29), (1, 0), (1, 4)];
        for p in check_gradients(&[x, w], &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "{p:?}");
        }
        Ok(())
    }

    #[test]
    fn half_precision_inputs_take_the_composed_path_and_agree_with_f32() -> Result<()> {
        let dev = Device::Cpu;
        let x = crate::gradcheck::seeded_randn(0f32, 1.0, (3, 8), &dev)?;
        let w = crate::gradcheck::seeded_randn(1f32, 0.2, 8, &dev)?;
        let reference = rms_norm(&x, &w, 1e-6)?;
        let half = rms_norm(&x.to_dtype(DType::BF16)?, &w.to_dtype(DType::BF16)?, 1e-6)?;
        assert_eq!(half.dtype(), DType::BF16);
        let diff = (half.to_dtype(DType::F32)? - reference)?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        assert!(diff < 0.05, "bf16 vs f32 diff {diff}");
        Ok(())
    }
}
