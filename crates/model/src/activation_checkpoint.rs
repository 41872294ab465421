//! Activation checkpointing: a block's forward runs without keeping its activations, and the
//! backward pass recomputes them, one block at a time.
//!
//! Why: a training step keeps every intermediate tensor of every block from the forward pass
//! to the backward pass (for SmolLM2-135M at batch 8 x 256 that is several GB). With
//! checkpointing only each block's input stays; the backward recomputes the block's forward
//! from it (about a third more arithmetic) and then frees that block's activations again.
//!
//! How, in candle (which has no checkpointing): the block becomes one graph node,
//! `y = checkpoint(x, anchor)` (a `CustomOp2`). Its forward runs the block and keeps only the
//! result. Its backward recomputes the block on a fresh leaf copy of `x`, runs an inner
//! backward of `sum(y * dy)` (so the gradient reaching `y` is exactly `dy`), returns `dx` and
//! stashes every parameter's gradient. The parameters reach the outer graph through `anchor`:
//! a chain of scalar "link" nodes, one per parameter (`a_i = link(a_{i-1}, p_i)`). The links
//! are upstream of the checkpoint node, so candle's topological backward always runs the
//! checkpoint's backward first; each link then hands its parameter's stashed gradient to the
//! outer `GradStore`. Every caller's plain `loss.backward()` therefore sees the same gradients
//! as without checkpointing: no side channel to drain, for every objective.
//!
//! Exactness: the recomputed forward is the same sequence of operations on the same values,
//! and the inner backward visits the block's nodes in the same order, so the gradients are
//! bit-identical to the non-checkpointed graph (tests/activation_checkpoint.rs). A variable shared
//! between checkpointed blocks would have its per-block sums added in another order (equal to
//! rounding); the transformer shares none.
//!
//! What it is not: a GPU implementation (CPU storage only; other devices run the block
//! without checkpointing), nor usable with a KV cache (generation does not need it).
//! Invariants: the block function is deterministic (no dropout), and `params` lists every
//! variable it reads (a variable left out would get no gradient: the tests check all of a
//! block's parameters arrive).

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, Var};

/// A block's forward: input hidden states to output hidden states.
pub(crate) type BlockFn = dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync;

/// `block(x)`, with the block's activations recomputed in the backward pass instead of kept.
/// `params` are the variables `block` reads (tensors of `Var`s); their gradients arrive through
/// the returned tensor's graph like any other.
pub(crate) fn checkpointed(x: &Tensor, params: &[Tensor], block: Arc<BlockFn>) -> Result<Tensor> {
    let (anchor, stash) = linked_params(params, x.device())?;
    x.apply_op2(
        &anchor,
        Checkpoint {
            block,
            params: params.to_vec(),
            stash,
            has_anchor: !params.is_empty(),
        },
    )
}

/// Gradients a block node computed for its parameters, slot `i` for `params[i]`, until the
/// parameter's link hands it to candle's gradient store.
pub(crate) type Stash = Arc<Mutex<Vec<Option<Tensor>>>>;

/// The anchor that ties `params` into the graph upstream of a node whose backward computes
/// their gradients itself (a checkpointed or fused block): the node takes the anchor as an
/// input, returns a zero gradient for it, and puts `params[i]`'s gradient in `stash[i]`.
pub(crate) fn linked_params(
    params: &[Tensor],
    device: &candle_core::Device,
) -> Result<(Tensor, Stash)> {
    let stash = Arc::new(Mutex::new(vec![None; params.len()]));
    let mut anchor = Tensor::zeros((), DType::F32, device)?;
    for (slot, param) in params.iter().enumerate() {
        anchor = anchor.apply_op2(
            param,
            Link {
                stash: stash.clone(),
                slot,
                first: slot == 0,
            },
        )?;
    }
    Ok((anchor, stash))
}

pub(crate) fn lock(stash: &Stash) -> Result<std::sync::MutexGuard<'_, Vec<Option<Tensor>>>> {
    stash
        .lock()
        .map_err(|_| candle_core::Error::Msg("activation checkpoint: poisoned lock".into()))
}

/// The checkpointed block as one graph node (see the module doc).
struct Checkpoint {
    block: Arc<BlockFn>,
    params: Vec<Tensor>,
    stash: Stash,
    /// Whether `anchor` carries parameters (a block without variables has a constant anchor).
    has_anchor: bool,
}

const NAME: &str = "stoke-activation-checkpoint";

/// A graph-free tensor copied from contiguous CPU storage.
fn tensor_from_storage(storage: &CpuStorage, layout: &Layout) -> Result<Tensor> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{NAME}: non-contiguous input")
    };
    let device = candle_core::Device::Cpu;
    match storage {
        CpuStorage::F32(v) => Tensor::from_slice(&v[start..end], layout.shape(), &device),
        CpuStorage::F64(v) => Tensor::from_slice(&v[start..end], layout.shape(), &device),
        _ => candle_core::bail!("{NAME}: f32 and f64 only"),
    }
}

/// The values of a CPU tensor as owned storage.
fn storage_of(t: &Tensor) -> Result<CpuStorage> {
    let flat = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::F32 => CpuStorage::F32(flat.to_vec1()?),
        DType::F64 => CpuStorage::F64(flat.to_vec1()?),
        other => candle_core::bail!("{NAME}: unsupported dtype {other:?}"),
    })
}

impl CustomOp2 for Checkpoint {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        _s2: &CpuStorage,
        _l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        // The block runs on a copy of x; its graph (and with it every activation) is dropped
        // when `y` is, at the end of this call.
        let x = tensor_from_storage(s1, l1)?;
        let y = (self.block)(&x)?;
        Ok((storage_of(&y)?, y.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        anchor: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let leaf = Var::from_tensor(&x.detach())?;
        let y = (self.block)(leaf.as_tensor())?;
        let grads = (y * grad_res.detach())?.sum_all()?.backward()?;
        let dx = grads.get(leaf.as_tensor()).cloned();
        let mut stash = lock(&self.stash)?;
        for (slot, param) in stash.iter_mut().zip(&self.params) {
            *slot = grads.get(param).cloned();
        }
        let danchor = if self.has_anchor {
            Some(anchor.zeros_like()?)
        } else {
            None
        };
        Ok((dx, danchor))
    }
}

/// `link(a, p) = 0`: ties parameter `p` into the graph upstream of a checkpoint; its backward
/// hands over the gradient the checkpoint's backward stashed for `p`.
struct Link {
    stash: Stash,
    slot: usize,
    /// The first link's `a` is a constant (no gradient to pass on).
    first: bool,
}

impl CustomOp2 for Link {
    fn name(&self) -> &'static str {
        "stoke-activation-checkpoint-link"
    }

    fn cpu_fwd(
        &self,
        _s1: &CpuStorage,
        _l1: &Layout,
        _s2: &CpuStorage,
        _l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Ok((CpuStorage::F32(vec![0.0]), Shape::from(())))
    }

    fn bwd(
        &self,
        anchor: &Tensor,
        _param: &Tensor,
        _res: &Tensor,
        _grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = lock(&self.stash)?[self.slot].take();
        let danchor = if self.first {
            None
        } else {
            Some(anchor.zeros_like()?)
        };
        Ok((danchor, grad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn values(t: &Tensor) -> Vec<f64> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    fn make_block(w: &Var, b: &Var) -> impl Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static {
        let (w, b) = (w.clone(), b.clone());
        move |x: &Tensor| -> Result<Tensor> {
            let h = x
                .matmul(w.as_tensor())?
                .broadcast_add(b.as_tensor())?
                .tanh()?;
            // Back to width 3 through w^T (w used twice), plus a residual (x used twice).
            x + h.matmul(&w.as_tensor().t()?)?.sqr()?
        }
    }

    /// Two blocks with their own parameters, as the transformer's are.
    #[test]
    fn gradients_equal_the_plain_graph_bit_for_bit() -> Result<()> {
        let dev = Device::Cpu;
        let var = |n: usize, seed: f64, shape: &[usize]| {
            let v: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37 + seed).sin()).collect();
            Var::from_vec(v, shape, &dev)
        };
        let (w1, b1) = (var(6, 0.1, &[3, 2])?, var(2, 0.2, &[2])?);
        let (w2, b2) = (var(6, 0.3, &[3, 2])?, var(2, 0.4, &[2])?);
        let x0 = var(12, 0.5, &[4, 3])?;
        let plain = {
            let h1 = make_block(&w1, &b1)(x0.as_tensor())?;
            make_block(&w2, &b2)(&h1)?.sqr()?.sum_all()?.backward()?
        };
        let ckpt = {
            let h1 = checkpointed(
                x0.as_tensor(),
                &[w1.as_tensor().clone(), b1.as_tensor().clone()],
                Arc::new(make_block(&w1, &b1)),
            )?;
            checkpointed(
                &h1,
                &[w2.as_tensor().clone(), b2.as_tensor().clone()],
                Arc::new(make_block(&w2, &b2)),
            )?
            .sqr()?
            .sum_all()?
            .backward()?
        };
        for var in [&w1, &b1, &w2, &b2, &x0] {
            let a = values(plain.get(var.as_tensor()).expect("plain gradient"));
            let c = values(ckpt.get(var.as_tensor()).expect("checkpointed gradient"));
            assert_eq!(a, c);
        }
        Ok(())
    }

    #[test]
    fn forward_values_are_the_blocks() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::new(&[[1.0f32, 2.0], [3.0, -4.0]], &dev)?;
        let block: Arc<BlockFn> = Arc::new(|x: &Tensor| (x * 2.0)?.exp());
        let y = checkpointed(&x, &[], block.clone())?;
        assert_eq!(
            y.flatten_all()?.to_vec1::<f32>()?,
            block(&x)?.flatten_all()?.to_vec1::<f32>()?
        );
        Ok(())
    }
}
