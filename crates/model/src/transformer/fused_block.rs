//! A decoder layer as one graph node: `stoke_ops::block`'s forward and hand-written backward
//! behind candle's autograd, for training and for scoring without a KV cache.
//!
//! How it joins the graph: `y = block(x, anchor)` is a `CustomOp2`, and the layer's parameters
//! reach it through `anchor`, the same link chain activation checkpointing uses
//! (`activation_checkpoint::linked_params`): the node's backward computes every parameter's
//! gradient and stashes it, and each link hands its parameter's gradient to candle's store. So
//! a caller's plain `loss.backward()` sees the gradients the layer's composition would give
//! (equal up to summation order: `tests/fused_block.rs` checks them on every fixture).
//!
//! Activation checkpointing: the node keeps no activations and its backward recomputes the
//! forward first (the same arithmetic, so checkpointed gradients equal the plain ones bit for
//! bit).
//!
//! When it is used ([`applies`]): CPU tensors in f32 or f64, no KV cache, no LoRA adapter, no
//! packed inference-only weights, and biases only where Qwen2 has them (q, k, v). Everything
//! else takes the composition (`layer.rs`), as does every layer when `STOKE_BLOCK=graph`
//! is set (for comparisons).

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{
    CpuStorage, CustomOp2, DType, Layout, Result, Shape, Storage, Tensor, WithDType,
};
use stoke_ops::Precision;
use stoke_ops::block::{
    self, BlockActivations, BlockGrads, BlockInputs, BlockReal, BlockShape, BlockWeights, KeyRuns,
};

use super::layer::DecoderLayer;
use super::linear::Linear;
use crate::activation_checkpoint::{Stash, linked_params, lock};

/// What every layer of one forward pass shares: RoPE tables `[N, head_dim]`, the mask and its
/// allowed keys.
pub(crate) struct FusedInputs {
    cos: Tensor,
    sin: Tensor,
    bias: Tensor,
    runs: KeyRuns,
    batch: usize,
    len: usize,
}

impl FusedInputs {
    /// `cos`/`sin` `[B, T, 1, D]`, `bias` `[Bb, Hb, T, T]`, all in the model's dtype.
    pub(crate) fn new(cos: &Tensor, sin: &Tensor, bias: &Tensor) -> Result<FusedInputs> {
        let (batch, len, _, dim) = cos.dims4()?;
        let cos = cos.reshape((batch * len, dim))?.contiguous()?;
        let sin = sin.reshape((batch * len, dim))?.contiguous()?;
        let bias = bias.contiguous()?.detach();
        let k_len = bias.dim(3)?;
        let runs = match bias.dtype() {
            DType::F32 => block::mask_runs(&bias.flatten_all()?.to_vec1::<f32>()?, k_len),
            DType::F64 => block::mask_runs(&bias.flatten_all()?.to_vec1::<f64>()?, k_len),
            other => candle_core::bail!("fused block: f32 or f64 only, got {other:?}"),
        };
        Ok(FusedInputs {
            cos,
            sin,
            bias,
            runs,
            batch,
            len,
        })
    }
}

/// Whether the fused node can run this layer (see the module doc).
pub(crate) fn applies(layer: &DecoderLayer, x: &Tensor) -> bool {
    let graph_only = stoke_ops::dispatch::block_path() == stoke_ops::dispatch::BlockPath::Graph;
    let plain = |l: &Linear| l.lora.is_none() && l.packed.is_none();
    let Some(a) = layer.self_attn.standard() else {
        return false;
    };
    let Some((gate_proj, up_proj, down_proj)) = layer.mlp.dense() else {
        return false;
    };
    !graph_only
        && x.device().is_cpu()
        && matches!(x.dtype(), DType::F32 | DType::F64)
        && layer.linears().into_iter().all(plain)
        && [&a.o_proj, gate_proj, up_proj, down_proj]
            .iter()
            .all(|l| l.bias.is_none())
}

/// The layer's tensors in the order of `BlockWeights`' fields (absent ones are `None`).
fn tensors(layer: &DecoderLayer) -> Result<[Option<Tensor>; 14]> {
    let Some(a) = layer.self_attn.standard() else {
        candle_core::bail!("the fused block runs grouped-query attention only (see `applies`)")
    };
    let Some((gate_proj, up_proj, down_proj)) = layer.mlp.dense() else {
        candle_core::bail!("the fused block runs dense MLPs only (see `applies`)")
    };
    Ok([
        Some(layer.input_layernorm.clone()),
        Some(a.q_proj.weight.clone()),
        Some(a.k_proj.weight.clone()),
        Some(a.v_proj.weight.clone()),
        a.q_proj.bias.clone(),
        a.k_proj.bias.clone(),
        a.v_proj.bias.clone(),
        a.q_norm.clone(),
        a.k_norm.clone(),
        Some(a.o_proj.weight.clone()),
        Some(layer.post_attention_layernorm.clone()),
        Some(gate_proj.weight.clone()),
        Some(up_proj.weight.clone()),
        Some(down_proj.weight.clone()),
    ])
}

/// `layer(x)` for x `[B, T, hidden]` through the fused node; `checkpoint` recomputes the
/// activations in the backward pass instead of keeping them.
pub(crate) fn forward(
    layer: &DecoderLayer,
    x: &Tensor,
    inputs: &Arc<FusedInputs>,
    shape: BlockShape,
    precision: Precision,
    checkpoint: bool,
) -> Result<Tensor> {
    let weights = tensors(layer)?;
    let present: Vec<Tensor> = weights.iter().flatten().cloned().collect();
    // Gradients go to the variables among them (a frozen tensor gets none).
    let slots: Vec<Option<usize>> = {
        let mut next = 0;
        weights
            .iter()
            .map(|t| match t {
                Some(t) if t.is_variable() => {
                    next += 1;
                    Some(next - 1)
                }
                _ => None,
            })
            .collect()
    };
    let params: Vec<Tensor> = present.into_iter().filter(Tensor::is_variable).collect();
    let (anchor, stash) = linked_params(&params, x.device())?;
    let wants_grad = x.track_op() || !params.is_empty();
    let op = FusedBlock {
        weights,
        slots,
        stash,
        inputs: inputs.clone(),
        shape,
        precision,
        keep: wants_grad && !checkpoint,
        saved: Mutex::new(None),
    };
    x.contiguous()?.apply_op2(&anchor, op)
}

enum Saved {
    F32(BlockActivations<f32>),
    F64(BlockActivations<f64>),
}

struct FusedBlock {
    weights: [Option<Tensor>; 14],
    /// Stash slot of each weight that is a variable.
    slots: Vec<Option<usize>>,
    stash: Stash,
    inputs: Arc<FusedInputs>,
    shape: BlockShape,
    precision: Precision,
    /// Keep the activations from forward to backward (false: none is wanted, or checkpointing).
    keep: bool,
    saved: Mutex<Option<Saved>>,
}

const NAME: &str = "stoke-decoder-block";

/// A contiguous CPU tensor's values.
fn values<'a, T: WithDType>(storage: &'a Storage, layout: &Layout) -> Result<&'a [T]> {
    let Storage::Cpu(cpu) = storage else {
        candle_core::bail!("{NAME}: CPU tensors only")
    };
    let data = T::cpu_storage_as_slice(cpu)?;
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{NAME}: non-contiguous tensor")
    };
    Ok(&data[start..end])
}

/// Runs `f` on the values of every tensor (`None` stays `None`).
fn with_values<T: WithDType, R>(
    tensors: &[Option<&Tensor>],
    f: impl FnOnce(&[Option<&[T]>]) -> Result<R>,
) -> Result<R> {
    let guards: Vec<_> = tensors
        .iter()
        .map(|t| t.map(|t| t.storage_and_layout()))
        .collect();
    let slices = guards
        .iter()
        .map(|g| match g {
            Some((storage, layout)) => values::<T>(storage, layout).map(Some),
            None => Ok(None),
        })
        .collect::<Result<Vec<_>>>()?;
    f(&slices)
}

fn block_weights<'a, T>(w: &[Option<&'a [T]>]) -> BlockWeights<'a, T> {
    let need = |i: usize| w[i].unwrap_or(&[]);
    BlockWeights {
        input_layernorm: need(0),
        q_proj: need(1),
        k_proj: need(2),
        v_proj: need(3),
        q_bias: w[4],
        k_bias: w[5],
        v_bias: w[6],
        q_norm: w[7],
        k_norm: w[8],
        o_proj: need(9),
        post_attention_layernorm: need(10),
        gate_proj: need(11),
        up_proj: need(12),
        down_proj: need(13),
    }
}

fn grads_in_order<T>(g: BlockGrads<T>) -> [Option<Vec<T>>; 14] {
    [
        Some(g.input_layernorm),
        Some(g.q_proj),
        Some(g.k_proj),
        Some(g.v_proj),
        g.q_bias,
        g.k_bias,
        g.v_bias,
        g.q_norm,
        g.k_norm,
        Some(g.o_proj),
        Some(g.post_attention_layernorm),
        Some(g.gate_proj),
        Some(g.up_proj),
        Some(g.down_proj),
    ]
}

trait Element: BlockReal + WithDType {
    fn wrap(saved: BlockActivations<Self>) -> Saved;
    fn unwrap(saved: Saved) -> Option<BlockActivations<Self>>;
}

impl Element for f32 {
    fn wrap(saved: BlockActivations<f32>) -> Saved {
        Saved::F32(saved)
    }
    fn unwrap(saved: Saved) -> Option<BlockActivations<f32>> {
        match saved {
            Saved::F32(s) => Some(s),
            Saved::F64(_) => None,
        }
    }
}

impl Element for f64 {
    fn wrap(saved: BlockActivations<f64>) -> Saved {
        Saved::F64(saved)
    }
    fn unwrap(saved: Saved) -> Option<BlockActivations<f64>> {
        match saved {
            Saved::F64(s) => Some(s),
            Saved::F32(_) => None,
        }
    }
}

impl FusedBlock {
    fn tensor_refs(&self) -> Vec<Option<&Tensor>> {
        let i = &self.inputs;
        let mut refs: Vec<Option<&Tensor>> = self.weights.iter().map(Option::as_ref).collect();
        refs.extend([Some(&i.cos), Some(&i.sin), Some(&i.bias)]);
        refs
    }

    /// Runs `f` with the block's weights and shared inputs as slices.
    fn with_block<T: Element, R>(
        &self,
        f: impl FnOnce(&BlockWeights<'_, T>, &BlockInputs<'_, T>) -> Result<R>,
    ) -> Result<R> {
        let shape = &self.shape;
        with_values::<T, R>(&self.tensor_refs(), |v| {
            let inputs = BlockInputs {
                cos: v[14].unwrap_or(&[]),
                sin: v[15].unwrap_or(&[]),
                bias: v[16].unwrap_or(&[]),
                bias_batch: self.inputs.bias.dim(0)?,
                bias_heads: self.inputs.bias.dim(1)?,
                runs: &self.inputs.runs,
            };
            if self.inputs.batch != shape.batch || self.inputs.len != shape.len {
                candle_core::bail!("{NAME}: the inputs are for another batch shape")
            }
            f(&block_weights(&v[..14]), &inputs)
        })
    }

    fn fwd<T: Element>(&self, x: &[T]) -> Result<Vec<T>> {
        let (y, saved) = self.with_block::<T, _>(|w, inputs| {
            Ok(block::forward(
                &self.shape,
                w,
                inputs,
                self.precision,
                x,
                self.keep,
            ))
        })?;
        *self.saved.lock().unwrap_or_else(PoisonError::into_inner) = saved.map(T::wrap);
        Ok(y)
    }

    fn bwd_typed<T: Element>(&self, x: &Tensor, grad: &Tensor) -> Result<Tensor> {
        let saved = self
            .saved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .and_then(T::unwrap);
        let x = x.contiguous()?;
        let grad = grad.contiguous()?;
        let (dx, grads) = with_values::<T, _>(&[Some(&x), Some(&grad)], |v| {
            let (x, dy) = (v[0].unwrap_or(&[]), v[1].unwrap_or(&[]));
            self.with_block::<T, _>(|w, inputs| {
                Ok(block::backward(
                    &self.shape,
                    w,
                    inputs,
                    self.precision,
                    x,
                    saved,
                    dy,
                ))
            })
        })?;
        let mut stash = lock(&self.stash)?;
        for ((grad, slot), weight) in grads_in_order(grads)
            .into_iter()
            .zip(&self.slots)
            .zip(&self.weights)
        {
            if let (Some(grad), Some(slot), Some(weight)) = (grad, slot, weight) {
                stash[*slot] = Some(Tensor::from_vec(grad, weight.shape(), weight.device())?);
            }
        }
        Tensor::from_vec(dx, x.shape(), x.device())
    }
}

impl CustomOp2 for FusedBlock {
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
        let Some((start, end)) = l1.contiguous_offsets() else {
            candle_core::bail!("{NAME}: non-contiguous input")
        };
        let storage = match s1 {
            CpuStorage::F32(v) => CpuStorage::F32(self.fwd::<f32>(&v[start..end])?),
            CpuStorage::F64(v) => CpuStorage::F64(self.fwd::<f64>(&v[start..end])?),
            _ => candle_core::bail!("{NAME}: f32 and f64 only"),
        };
        Ok((storage, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        anchor: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dx = match x.dtype() {
            DType::F32 => self.bwd_typed::<f32>(x, grad_res)?,
            DType::F64 => self.bwd_typed::<f64>(x, grad_res)?,
            other => candle_core::bail!("{NAME}: f32 and f64 only, got {other:?}"),
        };
        let has_anchor = self.slots.iter().any(Option::is_some);
        let danchor = if has_anchor {
            Some(anchor.zeros_like()?)
        } else {
            None
        };
        Ok((Some(dx), danchor))
    }
}

/// Inference through the fused block, with the layer's keys (after RoPE) and values for a KV
/// cache: `(y, k, v)`, `y` `[B, T, hidden]` (bit-identical to `forward`'s), `k` and `v`
/// `[B, kv_heads, T, head_dim]`. Nothing joins the autograd graph: a prompt's prefill.
pub(crate) fn forward_with_kv(
    layer: &DecoderLayer,
    x: &Tensor,
    inputs: &Arc<FusedInputs>,
    shape: BlockShape,
    precision: Precision,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = FusedBlock {
        weights: tensors(layer)?,
        slots: Vec::new(),
        stash: Stash::default(),
        inputs: inputs.clone(),
        shape,
        precision,
        keep: false,
        saved: Mutex::new(None),
    };
    let x = x.detach().contiguous()?;
    let kv_dims = (shape.batch, shape.kv_heads, shape.len, shape.head_dim);
    fn run<T: Element>(op: &FusedBlock, x: &Tensor) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
        with_values::<T, _>(&[Some(x)], |v| {
            let x = v[0].unwrap_or(&[]);
            op.with_block::<T, _>(|w, inputs| {
                Ok(block::forward_with_kv(
                    &op.shape,
                    w,
                    inputs,
                    op.precision,
                    x,
                ))
            })
        })
    }
    let device = x.device();
    match x.dtype() {
        DType::F32 => {
            let (y, k, v) = run::<f32>(&op, &x)?;
            Ok((
                Tensor::from_vec(y, x.shape(), device)?,
                Tensor::from_vec(k, kv_dims, device)?,
                Tensor::from_vec(v, kv_dims, device)?,
            ))
        }
        DType::F64 => {
            let (y, k, v) = run::<f64>(&op, &x)?;
            Ok((
                Tensor::from_vec(y, x.shape(), device)?,
                Tensor::from_vec(k, kv_dims, device)?,
                Tensor::from_vec(v, kv_dims, device)?,
            ))
        }
        other => candle_core::bail!("{NAME}: f32 and f64 only, got {other:?}"),
    }
}
