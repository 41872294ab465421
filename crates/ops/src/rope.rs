//! Rotary position embedding applied as transformers' `apply_rotary_pos_emb`:
//! `x * cos + rotate_half(x) * sin`, where `rotate_half([x1, x2]) = [-x2, x1]` splits the last
//! dimension in halves (the "neox"/HF layout, not interleaved pairs).
//!
//! The cos/sin tables (including any scaling such as YaRN's attention factor) are computed by
//! the model from absolute positions; this module only applies them. They are constants in
//! the graph (no gradient flows into them).

use candle_core::{D, Result, Tensor};

/// `x`: [..., head_dim]; `cos`, `sin`: broadcastable to `x` (e.g. [B, T, 1, D] against
/// x [B, T, H, D]). `head_dim` must be even.
pub fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let first = x.narrow(D::Minus1, 0, half)?;
    let second = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&second.neg()?, &first], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::{Device, Var};

    #[test]
    fn rotates_each_pair_of_halves_by_its_angle() -> Result<()> {
        // One position, head_dim 4: pairs (x0, x2) and (x1, x3) rotate by angles a0 and a1.
        let dev = Device::Cpu;
        let (a0, a1) = (0.3f64, 1.1f64);
        let x = [1.0f64, 2.0, 3.0, 4.0];
        let cos = Tensor::new(&[a0.cos(), a1.cos(), a0.cos(), a1.cos()], &dev)?;
        let sin = Tensor::new(&[a0.sin(), a1.sin(), a0.sin(), a1.sin()], &dev)?;
        let out = apply_rope(&Tensor::new(&x, &dev)?, &cos, &sin)?.to_vec1::<f64>()?;
        let expected = [
            x[0] * a0.cos() - x[2] * a0.sin(),
            x[1] * a1.cos() - x[3] * a1.sin(),
            x[2] * a0.cos() + x[0] * a0.sin(),
            x[3] * a1.cos() + x[1] * a1.sin(),
        ];
        for (o, e) in out.iter().zip(expected) {
            assert!((o - e).abs() < 1e-12, "{out:?} vs {expected:?}");
        }
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f64, 1.0, (2, 3, 2, 4), &dev)?)?;
        let angles = Tensor::randn(0f64, 1.0, (2, 3, 1, 4), &dev)?;
        let (cos, sin) = (angles.cos()?, angles.sin()?);
        let probe = Tensor::randn(0f64, 1.0, (2, 3, 2, 4), &dev)?;
        let loss = |v: &[Var]| {
            apply_rope(v[0].as_tensor(), &cos, &sin)?
                .mul(&probe)?
                .sum_all()
        };
        let coords: Vec<(usize, usize)> = (0..48).step_by(5).map(|i| (0, i)).collect();
        for p in check_gradients(&[x], &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "{p:?}");
        }
        Ok(())
    }
}
