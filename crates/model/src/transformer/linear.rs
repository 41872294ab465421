//! A linear layer of the model (`y = x W^T + b`, with an optional LoRA adapter and an optional
//! bf16 copy packed for inference), its LoRA adapter (`LoraAdapter`), and the packing of weights
//! into one huge-page region.
//!
//! What it is not: a parameter owner. The tensors are the model's variables (trainable) or,
//! once frozen, detached views of them; `Transformer::parameters` lists the variables.
//!
//! Invariants: a packed copy is used only where `stoke_ops::linear::uses_bf16` says the
//! precision and input allow it; otherwise the f32 weight is read. A LoRA adapter adds
//! `scale * x A^T B^T` on top of whichever path computed `x W^T + b`.

use crate::error::ModelError;
use candle_core::Tensor;
use std::sync::Arc;
use stoke_ops::Precision;
use stoke_ops::bf16::PackedA;
use stoke_ops::pages::PageRegion;

/// `y = x W^T + b` on [N, in] inputs, plus `scale * x A^T B^T` with a LoRA adapter.
/// The tensors are the model's variables (trainable) or, once frozen, detached views of them.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
    /// The weight in bf16, packed once for inference (`Transformer::pack_weights`).
    pub(crate) packed: Option<Arc<PackedA>>,
    pub(crate) lora: Option<LoraAdapter>,
}

impl Linear {
    pub(super) fn forward(&self, x: &Tensor, precision: Precision) -> candle_core::Result<Tensor> {
        let y = match &self.packed {
            Some(packed) if stoke_ops::linear::uses_bf16(precision, &[x]) => {
                stoke_ops::linear::linear_prepacked(x, packed)?
            }
            _ => stoke_ops::linear(x, &self.weight, precision)?,
        };
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        match &self.lora {
            Some(lora) => {
                let low = stoke_ops::linear(x, &lora.a, precision)?;
                y + stoke_ops::linear(&low, &lora.b, precision)?.affine(lora.scale, 0.0)?
            }
            None => Ok(y),
        }
    }

    /// `W + scale · B A` (the weight with its adapter merged): what the layer multiplies by,
    /// for paths that use the matrix itself (MLA's absorbed decode).
    pub(super) fn effective_weight(&self) -> candle_core::Result<Tensor> {
        match &self.lora {
            Some(lora) => self.weight.clone() + lora.b.matmul(&lora.a)?.affine(lora.scale, 0.0)?,
            None => Ok(self.weight.clone()),
        }
    }

    /// The variables this layer reads (a frozen weight is none).
    pub(super) fn tracked(&self) -> impl Iterator<Item = &Tensor> {
        let lora = self.lora.iter().flat_map(|l| [&l.a, &l.b]);
        std::iter::once(&self.weight)
            .chain(self.bias.iter())
            .chain(lora)
            .filter(|t| t.is_variable())
    }
}

/// A weight `[out, in]` in bf16 for inference (`pack_weights`, `inference_copy`), in `region`
/// where there is one.
pub(super) fn pack(
    weight: &Tensor,
    region: Option<&Arc<PageRegion>>,
) -> Result<Arc<PackedA>, ModelError> {
    let (n, k) = weight.dims2()?;
    let values: Vec<f32> = weight.flatten_all()?.to_vec1()?;
    Ok(Arc::new(PackedA::from_rows_in(&values, n, k, region)))
}

/// One region of huge pages for a model's packed weights (decoding streams them all every step;
/// see `stoke_ops::pages`), sized for `weights` (each `[out, in]`). `None` where the platform has
/// none: the weights then go on the heap.
pub(super) fn packing_region<'a>(
    weights: impl Iterator<Item = &'a Tensor>,
) -> Result<Option<Arc<PageRegion>>, ModelError> {
    let mut words = 0;
    for weight in weights {
        let (n, k) = weight.dims2()?;
        words += PageRegion::words_for(PackedA::words(n, k));
    }
    Ok(PageRegion::new(words))
}

/// One linear layer's adapter: `scale * x A^T B^T`.
#[derive(Clone, Debug)]
pub(crate) struct LoraAdapter {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
}
