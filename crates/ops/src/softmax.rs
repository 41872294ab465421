//! Softmax and log-softmax over one dimension as differentiable compositions.
//!
//! The row maximum is subtracted for stability and detached: softmax is invariant to a
//! per-row shift, so the true gradient through the maximum is zero, and detaching avoids
//! building candle's mask-based backward for `max`. Rows may contain `-inf` (masked
//! attention scores) as long as each row has at least one finite entry.

use candle_core::{Result, Tensor};

/// `exp(x - max) / sum(exp(x - max))` along `dim`.
pub fn softmax<Dim: candle_core::shape::Dim + Copy>(x: &Tensor, dim: Dim) -> Result<Tensor> {
    let max = x.max_keepdim(dim)?.detach();
    let exp = x.broadcast_sub(&max)?.exp()?;
    let sum = exp.sum_keepdim(dim)?;
    exp.broadcast_div(&sum)
}

/// `x - max - log(sum(exp(x - max)))` along `dim`.
pub fn log_softmax<Dim: candle_core::shape::Dim + Copy>(x: &Tensor, dim: Dim) -> Result<Tensor> {
    let max = x.max_keepdim(dim)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(dim)?.log()?;
    shifted.broadcast_sub(&log_sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::{D, Device, Var};

    fn reference_softmax(row: &[f64]) -> Vec<f64> {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        exps.iter().map(|e| e / sum).collect()
    }

    #[test]
    fn softmax_and_log_softmax_match_reference_including_masked_entries() -> Result<()> {
        let rows = [
            vec![1.0f64, 2.0, 3.0, -1.0],
            vec![0.5, f64::NEG_INFINITY, 100.0, 99.0],
        ];
        let flat: Vec<f64> = rows.iter().flatten().cloned().collect();
        let x = Tensor::from_vec(flat, (2, 4), &Device::Cpu)?;
        let sm = softmax(&x, D::Minus1)?.to_vec2::<f64>()?;
        let lsm = log_softmax(&x, 1)?.to_vec2::<f64>()?;
        for (r, row) in rows.iter().enumerate() {
            let expected = reference_softmax(row);
            for c in 0..4 {
                assert!((sm[r][c] - expected[c]).abs() < 1e-12);
                assert!(
                    expected[c] == 0.0 && lsm[r][c] == f64::NEG_INFINITY
                        || (lsm[r][c] - expected[c].ln()).abs() < 1e-12
                );
            }
        }
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&crate::gradcheck::seeded_randn(0f64, 2.0, (3, 6), &dev)?)?;
        let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (3, 6), &dev)?;
        let coords: Vec<(usize, usize)> = (0..18).step_by(4).map(|i| (0, i)).collect();
        let sm_loss = |v: &[Var]| softmax(v[0].as_tensor(), D::Minus1)?.mul(&probe)?.sum_all();
        for p in check_gradients(std::slice::from_ref(&x), &sm_loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "softmax {p:?}");
        }
        let lsm_loss = |v: &[Var]| {
            log_softmax(v[0].as_tensor(), D::Minus1)?
                .mul(&probe)?
                .sum_all()
        };
        for p in check_gradients(&[x], &lsm_loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "log_softmax {p:?}");
        }
        Ok(())
    }
}
