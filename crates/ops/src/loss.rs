//! Token-level log-probabilities and masked cross-entropy, as differentiable compositions.
//!
//! `token_logprobs` computes `logit[target] - logsumexp(logits)` per row in one fused pass
//! (kernels.rs) without materialising the log-softmax matrix; it is the building block for
//! next-token loss, DPO and GRPO.

use candle_core::{DType, Result, Tensor};

/// `logits`: [N, V] float; `targets`: [N] u32 (any value < V). Returns [N] log p(target).
/// Fused kernel with closed-form backward (see kernels.rs).
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    crate::kernels::target_logprobs(logits, targets)
}

/// Mean negative log-likelihood over the rows where `mask` is non-zero:
/// `sum(-log p(target) * mask) / sum(mask)`. `mask`: [N] float (0/1 or weights) of the
/// logits' dtype. Returns a scalar; NaN if the mask is all zero (no token to average over).
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let mask = mask.to_dtype(logits.dtype())?;
    let nll_sum = (token_logprobs(logits, targets)? * &mask)?
        .sum_all()?
        .neg()?;
    nll_sum / mask.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::{Device, Var};

    #[test]
    fn cross_entropy_matches_reference_and_ignores_masked_rows() -> Result<()> {
        let dev = Device::Cpu;
        let logits = [
            vec![1.0f64, 2.0, 0.5],
            vec![-1.0, 0.0, 3.0],
            vec![9.0, 9.0, 9.0],
        ];
        let targets = [2u32, 0, 1];
        let mask = [1.0f64, 1.0, 0.0];
        let flat: Vec<f64> = logits.iter().flatten().cloned().collect();
        let loss = cross_entropy(
            &Tensor::from_vec(flat, (3, 3), &dev)?,
            &Tensor::new(&targets, &dev)?,
            &Tensor::new(&mask, &dev)?,
        )?
        .to_scalar::<f64>()?;
        let nll = |row: &[f64], t: usize| {
            let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            lse - row[t]
        };
        let expected = (nll(&logits[0], 2) + nll(&logits[1], 0)) / 2.0;
        assert!((loss - expected).abs() < 1e-12, "{loss} vs {expected}");
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        // Fixed logits (spread like N(0, 2) but reproducible): with unseeded random logits a
        // probed coordinate occasionally had a gradient ~1e-6, where the central difference's
        // rounding noise (~1e-10) alone exceeded the 1e-5 relative tolerance (flaky test).
        let values: Vec<f64> = (0..28)
            .map(|i| 2.0 * (i as f64 * 2.3 + 0.7).sin())
            .collect();
        let logits = Var::from_tensor(&Tensor::from_vec(values, (4, 7), &dev)?)?;
        let targets = Tensor::new(&[3u32, 0, 6, 2], &dev)?;
        let mask = Tensor::new(&[1.0f64, 0.0, 1.0, 1.0], &dev)?;
        let loss = |v: &[Var]| cross_entropy(v[0].as_tensor(), &targets, &mask);
        let coords: Vec<(usize, usize)> = (0..28).step_by(3).map(|i| (0, i)).collect();
        let points = check_gradients(&[logits], &loss, &coords, 1e-6)?;
        for p in &points {
            assert!(p.relative_error(1e-6) < 1e-5, "{p:?}");
            if (7..14).contains(&p.flat_index) {
                assert_eq!(p.analytic, 0.0, "masked row must get no gradient");
            }
        }
        Ok(())
    }
}
