//! Rotary position embedding applied as transformers' `apply_rotary_pos_emb`:
//! `x * cos + rotate_half(x) * sin`, where `rotate_half([x1, x2]) = [-x2, x1]` splits the last
//! dimension in halves (the "neox"/HF layout, not interleaved pairs).
//!
//! The cos/sin tables (including any scaling such as YaRN's attention factor) are computed by
//! the model from absolute positions; this module only applies them. They are constants in
//! the graph (no gradient flows into them).
//!
//! For the model's layout (x [B, T, H, D], tables [B, T, 1, D], f32/f64 on the CPU) the
//! rotation is one fused candle `CustomOp3` whose backward is the transposed rotation
//! (`dx1 = dy1 * cos1 + dy2 * sin2`, `dx2 = dy2 * cos2 - dy1 * sin1`), instead of seven
//! graph nodes (narrow, neg, cat, two broadcast multiplies, add). Other shapes use the
//! composition, which is also the reference in the tests.

use crate::kernels::{Real, contiguous_slice};
use candle_core::{CpuStorage, CustomOp3, D, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `x`: [..., head_dim]; `cos`, `sin`: broadcastable to `x` (e.g. [B, T, 1, D] against
/// x [B, T, H, D]). `head_dim` must be even.
pub fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if fused_applies(x, cos, sin) {
        return x.contiguous()?.apply_op3(
            &cos.contiguous()?,
            &sin.contiguous()?,
            Rope { transpose: false },
        );
    }
    apply_rope_composed(x, cos, sin)
}

/// The composition of candle ops (with candle's backward rules).
pub fn apply_rope_composed(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let first = x.narrow(D::Minus1, 0, half)?;
    let second = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&second.neg()?, &first], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

fn fused_applies(x: &Tensor, cos: &Tensor, sin: &Tensor) -> bool {
    let dims = x.dims();
    dims.len() == 4
        && dims[3].is_multiple_of(2)
        && x.device().is_cpu()
        && matches!(x.dtype(), DType::F32 | DType::F64)
        && cos.dtype() == x.dtype()
        && sin.dtype() == x.dtype()
        && cos.dims() == [dims[0], dims[1], 1, dims[3]]
        && sin.dims() == cos.dims()
}

/// Rotates rows of x [B, T, H, D] by table rows [B, T, 1, D]; `transpose` applies the
/// transposed rotation (the backward).
struct Rope {
    transpose: bool,
}

fn rotate<T: Real>(x: &[T], cos: &[T], sin: &[T], dims: &[usize], transpose: bool) -> Vec<T> {
    let (heads, width) = (dims[2], dims[3]);
    let half = width / 2;
    let mut out = vec![T::zero(); x.len()];
    out.par_chunks_mut(width * heads)
        .zip(x.par_chunks(width * heads))
        .zip(cos.par_chunks(width).zip(sin.par_chunks(width)))
        .for_each(|((ys, xs), (c, s))| {
            for (y, x) in ys.chunks_mut(width).zip(xs.chunks(width)) {
                for i in 0..half {
                    let (a, b) = (x[i], x[half + i]);
                    if transpose {
                        y[i] = a * c[i] + b * s[half + i];
                        y[half + i] = b * c[half + i] - a * s[i];
                    } else {
                        y[i] = a * c[i] - b * s[i];
                        y[half + i] = b * c[half + i] + a * s[half + i];
                    }
                }
            }
        });
    out
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "stoke-rope"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dims = l1.shape().dims();
        if dims.len() != 4
            || l2.shape().dims() != [dims[0], dims[1], 1, dims[3]]
            || l3.shape() != l2.shape()
        {
            candle_core::bail!(
                "{}: expected x [B, T, H, D] and tables [B, T, 1, D]",
                self.name()
            )
        }
        let name = self.name();
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(x), CpuStorage::F32(c), CpuStorage::F32(s)) => {
                CpuStorage::F32(rotate(
                    contiguous_slice(x, l1, name)?,
                    contiguous_slice(c, l2, name)?,
                    contiguous_slice(s, l3, name)?,
                    dims,
                    self.transpose,
                ))
            }
            (CpuStorage::F64(x), CpuStorage::F64(c), CpuStorage::F64(s)) => {
                CpuStorage::F64(rotate(
                    contiguous_slice(x, l1, name)?,
                    contiguous_slice(c, l2, name)?,
                    contiguous_slice(s, l3, name)?,
                    dims,
                    self.transpose,
                ))
            }
            _ => candle_core::bail!("{name}: only f32 and f64 (same dtype)"),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dx = grad.contiguous()?.apply_op3_no_bwd(
            cos,
            sin,
            &Rope {
                transpose: !self.transpose,
            },
        )?;
        Ok((Some(dx), None, None))
    }
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
        let x = Var::from_tensor(&crate::gradcheck::seeded_randn(
            0f64,
            1.0,
            (2, 3, 2, 4),
            &dev,
        )?)?;
        let angles = crate::gradcheck::seeded_randn(0f64, 1.0, (2, 3, 1, 4), &dev)?;
        let (cos, sin) = (angles.cos()?, angles.sin()?);
        let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (2, 3, 2, 4), &dev)?;
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

    #[test]
    fn fused_forward_and_gradient_match_the_composition() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&crate::gradcheck::seeded_randn(
            0f64,
            1.0,
            (2, 3, 4, 6),
            &dev,
        )?)?;
        // Different tables for the two halves, so a swapped index would show.
        let cos = crate::gradcheck::seeded_randn(0f64, 1.0, (2, 3, 1, 6), &dev)?;
        let sin = crate::gradcheck::seeded_randn(0f64, 1.0, (2, 3, 1, 6), &dev)?;
        let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (2, 3, 4, 6), &dev)?;
        assert!(fused_applies(x.as_tensor(), &cos, &sin));
        let fused = apply_rope(x.as_tensor(), &cos, &sin)?;
        let composed = apply_rope_composed(x.as_tensor(), &cos, &sin)?;
        let max_diff = |a: &Tensor, b: &Tensor| -> Result<f64> {
            (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()
        };
        assert!(max_diff(&fused, &composed)? < 1e-14);
        let g_fused = fused.mul(&probe)?.sum_all()?.backward()?;
        let g_composed = composed.mul(&probe)?.sum_all()?.backward()?;
        let (a, b) = (
            g_fused.get(x.as_tensor()).expect("fused gradient"),
            g_composed.get(x.as_tensor()).expect("composed gradient"),
        );
        assert!(max_diff(a, b)? < 1e-14, "gradient diff {}", max_diff(a, b)?);
        Ok(())
    }
}
