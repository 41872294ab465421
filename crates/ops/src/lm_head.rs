//! The LM head and the target log-probabilities as one graph node:
//! `linear_target_logprobs(hidden, weight, targets)[n] = log softmax(hidden @ weight^T)[n, targets[n]]`.
//!
//! Why: as a composition (`matmul`, then `target_logprobs`) the [N, V] logits are a graph node
//! of their own, and candle's backward accumulates every node's gradient into a fresh zero
//! tensor (`zeros_like` + `add`): for the largest activation of the step (2040 x 4096 f32 =
//! 33 MB in the benchmark) that is an extra memset, an extra three-array pass and an extra
//! allocation, on top of the logits gradient itself. Here the logits never enter the graph:
//! the forward keeps them (inside the op, not as a graph tensor) for the backward, which turns
//! them into `dlogits = g * (onehot - softmax)` (one pass, the log-sum-exp taken from the
//! forward output) and multiplies out `dhidden = dlogits @ W` and `dW = dlogits^T @ hidden`
//! directly. Measured in bench/README.md ("Training (issue 5)").
//!
//! What it is not: memory-saving like Cut Cross-Entropy (the [N, V] logits are materialised
//! once and held from forward to backward, as the composition holds them too), nor a GPU
//! kernel (CPU f32/f64; other devices and dtypes take the composition, same values), nor
//! differentiable twice. If the op's backward runs a second time (or after the saved logits
//! were taken), the logits are recomputed, so results never depend on call order.
//! Invariants: hidden [N, H], weight [V, H] (the `nn.Linear` layout of `lm_head.weight`),
//! targets [N] with every value < V.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};

use crate::kernels::{Real, TargetLogprobsBackward, contiguous_slice, target_logprobs_rows};

/// `log softmax(hidden @ weight^T)[n, targets[n]]`: hidden [N, H], weight [V, H], targets [N]
/// (any integer dtype). Returns [N]. Gradients flow to `hidden` and `weight`.
pub fn linear_target_logprobs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
) -> Result<Tensor> {
    let (rows, width) = hidden.dims2()?;
    let (vocab, weight_width) = weight.dims2()?;
    if width != weight_width {
        candle_core::bail!(
            "linear_target_logprobs: hidden {:?} and weight {:?} disagree on the hidden size",
            hidden.dims(),
            weight.dims()
        )
    }
    let targets: Vec<u32> = targets.to_dtype(DType::U32)?.flatten_all()?.to_vec1()?;
    if targets.len() != rows {
        candle_core::bail!(
            "linear_target_logprobs: {} targets for {rows} rows",
            targets.len()
        )
    }
    if let Some(bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!(
            "linear_target_logprobs: target {bad} out of range for vocabulary {vocab}"
        )
    }
    let fused = hidden.device().is_cpu()
        && weight.device().is_cpu()
        && hidden.dtype() == weight.dtype()
        && matches!(hidden.dtype(), DType::F32 | DType::F64);
    if !fused {
        let logits = hidden.matmul(&weight.t()?)?;
        let targets = Tensor::from_vec(targets, rows, logits.device())?;
        return crate::kernels::target_logprobs(&logits, &targets);
    }
    hidden.contiguous()?.apply_op2(
        &weight.contiguous()?,
        LinearTargetLogprobs {
            targets,
            saved_logits: Mutex::new(None),
        },
    )
}

struct LinearTargetLogprobs {
    targets: Vec<u32>,
    /// The forward's [N, V] logits (a plain tensor, outside the graph), taken by the backward.
    saved_logits: Mutex<Option<Tensor>>,
}

/// A graph-free tensor holding a copy of contiguous CPU data.
fn plain_tensor<T: Real>(data: &[T], layout: &Layout, op: &str) -> Result<Tensor> {
    Tensor::from_slice(
        contiguous_slice(data, layout, op)?,
        layout.shape(),
        &Device::Cpu,
    )
}

impl LinearTargetLogprobs {
    fn forward<T: Real>(
        &self,
        hidden: &[T],
        hidden_layout: &Layout,
        weight: &[T],
        weight_layout: &Layout,
    ) -> Result<CpuStorage> {
        let name = "stoke-linear-target-logprobs";
        let hidden = plain_tensor(hidden, hidden_layout, name)?;
        let weight = plain_tensor(weight, weight_layout, name)?;
        let logits = hidden.matmul(&weight.t()?)?.contiguous()?;
        let vocab = logits.dim(1)?;
        let out = {
            let (storage, layout) = logits.storage_and_layout();
            let candle_core::Storage::Cpu(cpu) = &*storage else {
                candle_core::bail!("{name}: logits left the CPU")
            };
            let data = contiguous_slice(T::cpu_storage_as_slice(cpu)?, layout, name)?;
            target_logprobs_rows(data, vocab, &self.targets)
        };
        *self.lock_saved()? = Some(logits);
        Ok(T::to_cpu_storage_owned(out))
    }

    fn lock_saved(&self) -> Result<std::sync::MutexGuard<'_, Option<Tensor>>> {
        self.saved_logits
            .lock()
            .map_err(|_| candle_core::Error::Msg("linear_target_logprobs: poisoned lock".into()))
    }
}

impl CustomOp2 for LinearTargetLogprobs {
    fn name(&self) -> &'static str {
        "stoke-linear-target-logprobs"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = match (s1, s2) {
            (CpuStorage::F32(h), CpuStorage::F32(w)) => self.forward(h, l1, w, l2)?,
            (CpuStorage::F64(h), CpuStorage::F64(w)) => self.forward(h, l1, w, l2)?,
            _ => candle_core::bail!("{}: only f32 and f64 (same dtype)", self.name()),
        };
        Ok((out, Shape::from(self.targets.len())))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (hidden, weight) = (hidden.detach(), weight.detach());
        let saved = self.lock_saved()?.take();
        let logits = match saved {
            Some(logits) => logits,
            None => hidden.matmul(&weight.t()?)?.contiguous()?,
        };
        let dlogits = logits.apply_op3_no_bwd(
            &res.detach().contiguous()?,
            &grad_res.detach().contiguous()?,
            &TargetLogprobsBackward {
                targets: &self.targets,
            },
        )?;
        drop(logits);
        let dhidden = dlogits.matmul(&weight)?;
        let dweight = dlogits.t()?.matmul(&hidden)?;
        Ok((Some(dhidden), Some(dweight)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::Var;

    /// Deterministic values spread like N(0, scale) without a random generator.
    fn values(n: usize, seed: f64, scale: f64) -> Vec<f64> {
        (0..n)
            .map(|i| scale * (i as f64 * 1.37 + seed).sin())
            .collect()
    }

    fn composed(hidden: &Tensor, weight: &Tensor, targets: &Tensor) -> Result<Tensor> {
        crate::kernels::target_logprobs(&hidden.matmul(&weight.t()?)?, targets)
    }

    #[test]
    fn values_and_gradients_match_the_composition() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, width, vocab) = (6, 5, 11);
        let hidden = Var::from_vec(values(rows * width, 0.3, 1.5), (rows, width), &dev)?;
        let weight = Var::from_vec(values(vocab * width, 1.1, 0.8), (vocab, width), &dev)?;
        let targets = Tensor::new(&[0u32, 10, 3, 3, 7, 1], &dev)?;
        // A weighted sum so every row's gradient differs (and one row gets none).
        let row_weights = Tensor::new(&[1.0f64, -0.5, 2.0, 0.0, 0.7, 1.3], &dev)?;
        let run = |f: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>| -> Result<_> {
            let lp = f(hidden.as_tensor(), weight.as_tensor(), &targets)?;
            let grads = (&lp * &row_weights)?.sum_all()?.backward()?;
            let get = |v: &Var| -> Result<Vec<f64>> {
                grads
                    .get(v.as_tensor())
                    .ok_or_else(|| candle_core::Error::Msg("missing gradient".into()))?
                    .flatten_all()?
                    .to_vec1()
            };
            Ok((lp.to_vec1::<f64>()?, get(&hidden)?, get(&weight)?))
        };
        let fused = run(&|h, w, t| linear_target_logprobs(h, w, t))?;
        let reference = run(&composed)?;
        let close = |a: &[f64], b: &[f64], what: &str| {
            assert_eq!(a.len(), b.len());
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() < 1e-12,
                    "{what}[{i}]: fused {x} vs composed {y}"
                );
            }
        };
        close(&fused.0, &reference.0, "logprobs");
        close(&fused.1, &reference.1, "dhidden");
        close(&fused.2, &reference.2, "dweight");
        // Row 3 has weight 0: its hidden gradient must be exactly zero.
        assert!(fused.1[3 * width..4 * width].iter().all(|&g| g == 0.0));
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let hidden = Var::from_vec(values(4 * 3, 0.9, 1.0), (4, 3), &dev)?;
        let weight = Var::from_vec(values(7 * 3, 2.3, 1.2), (7, 3), &dev)?;
        let targets = Tensor::new(&[6u32, 0, 2, 2], &dev)?;
        let loss = |v: &[Var]| {
            linear_target_logprobs(v[0].as_tensor(), v[1].as_tensor(), &targets)?.sum_all()
        };
        let coords: Vec<(usize, usize)> = (0..12)
            .map(|i| (0, i))
            .chain((0..21).step_by(2).map(|i| (1, i)))
            .collect();
        for p in check_gradients(&[hidden, weight], &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-6, "{p:?}");
        }
        Ok(())
    }

    #[test]
    fn f32_agrees_with_the_composition() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, width, vocab) = (9, 16, 300);
        let to32 = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let hidden = Tensor::from_vec(to32(values(rows * width, 0.1, 1.0)), (rows, width), &dev)?;
        let weight = Tensor::from_vec(to32(values(vocab * width, 0.7, 0.5)), (vocab, width), &dev)?;
        let targets = Tensor::from_vec(
            (0..rows as u32).map(|i| i * 31).collect::<Vec<_>>(),
            rows,
            &dev,
        )?;
        let fused: Vec<f32> = linear_target_logprobs(&hidden, &weight, &targets)?.to_vec1()?;
        let reference: Vec<f32> = composed(&hidden, &weight, &targets)?.to_vec1()?;
        for (a, b) in fused.iter().zip(&reference) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        Ok(())
    }

    #[test]
    fn a_second_backward_recomputes_the_logits() -> Result<()> {
        let dev = Device::Cpu;
        let hidden = Var::from_vec(values(3 * 4, 0.5, 1.0), (3, 4), &dev)?;
        let weight = Var::from_vec(values(5 * 4, 1.5, 1.0), (5, 4), &dev)?;
        let targets = Tensor::new(&[4u32, 1, 0], &dev)?;
        let loss =
            linear_target_logprobs(hidden.as_tensor(), weight.as_tensor(), &targets)?.sum_all()?;
        let first = loss.backward()?;
        let second = loss.backward()?;
        for var in [&hidden, &weight] {
            let a: Vec<f64> = first
                .get(var.as_tensor())
                .map(|g| g.flatten_all())
                .transpose()?
                .map_or(Ok(vec![]), |g| g.to_vec1())?;
            let b: Vec<f64> = second
                .get(var.as_tensor())
                .map(|g| g.flatten_all())
                .transpose()?
                .map_or(Ok(vec![]), |g| g.to_vec1())?;
            assert!(!a.is_empty());
            assert_eq!(a, b);
        }
        Ok(())
    }

    #[test]
    fn bad_shapes_and_targets_are_rejected() -> Result<()> {
        let dev = Device::Cpu;
        let hidden = Tensor::zeros((2, 3), DType::F32, &dev)?;
        let weight = Tensor::zeros((5, 3), DType::F32, &dev)?;
        let narrow = Tensor::zeros((5, 4), DType::F32, &dev)?;
        assert!(linear_target_logprobs(&hidden, &narrow, &Tensor::new(&[0u32, 1], &dev)?).is_err());
        assert!(linear_target_logprobs(&hidden, &weight, &Tensor::new(&[0u32], &dev)?).is_err());
        assert!(linear_target_logprobs(&hidden, &weight, &Tensor::new(&[0u32, 5], &dev)?).is_err());
        Ok(())
    }
}
