//! Key/value cache for incremental decoding, passed explicitly to `Transformer::forward`.
//!
//! Holds per layer the keys (after RoPE) and values of every slot processed so far, each
//! [B, num_kv_heads, T_cached, head_dim]. Stored tensors are detached from the autograd graph:
//! the cache serves generation, and keeping the graph would pin every step's activations.
//! The model itself keeps no state, so one `Transformer` can serve many caches.
//!
//! Not (yet) preallocated: each step concatenates, which copies the cache (O(T^2) bytes over a
//! generation). A preallocated buffer written in place is the known next step for speed.

use crate::error::ModelError;
use candle_core::{D, Tensor};

#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    /// Per layer, the slots dropped from the front (a sliding-window layer keeps only the last
    /// `window - 1` slots between steps): the stored keys start at this absolute slot.
    first_slot: Vec<usize>,
    /// The position of every slot processed so far, [B, len] u32 (models with sliding-window
    /// layers only: their mask is by position).
    positions: Option<Tensor>,
}

impl KvCache {
    pub fn new(num_layers: usize) -> KvCache {
        KvCache {
            layers: vec![None; num_layers],
            first_slot: vec![0; num_layers],
            positions: None,
        }
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Cached sequence length, in slots processed (0 when empty); a sliding-window layer may
    /// hold fewer.
    pub fn len(&self) -> usize {
        match self.layers.first() {
            Some(Some((k, _))) => self.first_slot[0] + k.dim(D::Minus2).unwrap_or(0),
            _ => 0,
        }
    }

    /// The slots layer `layer` holds now (a sliding-window layer: at most `window - 1`).
    pub fn stored_len(&self, layer: usize) -> usize {
        match self.layers.get(layer) {
            Some(Some((k, _))) => k.dim(D::Minus2).unwrap_or(0),
            _ => 0,
        }
    }

    /// Whether some layer dropped slots (a sliding window's): such a cache cannot seed the
    /// fused decode step, whose layers hold every slot.
    pub fn is_windowed(&self) -> bool {
        self.first_slot.iter().any(|&f| f > 0)
    }

    /// Records this step's positions [B, T] after those of the cached slots and returns the
    /// positions of every key (cached + new).
    pub(crate) fn record_positions(&mut self, positions: &Tensor) -> Result<Tensor, ModelError> {
        let positions = positions.to_dtype(candle_core::DType::U32)?;
        let all = match &self.positions {
            Some(past) => Tensor::cat(&[past, &positions], 1)?,
            None => positions,
        };
        self.positions = Some(all.clone());
        Ok(all)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batch size of the cached tensors (None when empty).
    pub fn batch_size(&self) -> Option<usize> {
        match self.layers.first() {
            Some(Some((k, _))) => k.dim(0).ok(),
            _ => None,
        }
    }

    /// Bytes held by the cached keys and values.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum()
    }

    /// A cache whose row i is this cache's row `rows[i]`; rows may repeat (n samples sharing
    /// one prefill: `rows = [0; n]`) or be dropped (finished sequences).
    pub fn select_batch(&self, rows: &[usize]) -> Result<KvCache, ModelError> {
        let Some(batch) = self.batch_size() else {
            return Ok(self.clone());
        };
        if let Some(bad) = rows.iter().find(|&&r| r >= batch) {
            return Err(ModelError::InvalidArgument(format!(
                "select_batch: row {bad} out of range for batch {batch}"
            )));
        }
        let Some(Some((k0, _))) = self.layers.first() else {
            return Ok(self.clone());
        };
        let index: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let index = Tensor::new(index.as_slice(), k0.device())?;
        let layers = self
            .layers
            .iter()
            .map(|layer| match layer {
                Some((k, v)) => Ok(Some((
                    k.index_select(&index, 0)?,
                    v.index_select(&index, 0)?,
                ))),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let positions = match &self.positions {
            Some(p) => Some(p.index_select(&index.to_device(p.device())?, 0)?),
            None => None,
        };
        Ok(KvCache {
            layers,
            first_slot: self.first_slot.clone(),
            positions,
        })
    }

    /// Layer `layer`'s keys and values, `[B, num_kv_heads, len, head_dim]` each (None when
    /// empty).
    pub(crate) fn layer(&self, layer: usize) -> Option<&(Tensor, Tensor)> {
        self.layers.get(layer).and_then(Option::as_ref)
    }

    /// `append` for a layer that may have a sliding `window`: returns the keys and values to
    /// attend over and the absolute slot of their first entry, then keeps only the last
    /// `window - 1` slots (all a later query can see: its own slot is new then).
    ///
    /// Invariant: rows advance one position per slot (generation), so `window - 1` slots
    /// cover `window - 1` positions.
    pub(crate) fn append_windowed(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        window: Option<usize>,
    ) -> Result<(Tensor, Tensor, usize), ModelError> {
        let first = self.first_slot.get(layer).copied().unwrap_or(0);
        let (k_all, v_all) = self.append(layer, k, v)?;
        if let Some(window) = window {
            let stored = k_all.dim(2)?;
            let keep = window.saturating_sub(1);
            if stored > keep {
                let drop = stored - keep;
                self.layers[layer] = Some((
                    k_all.narrow(2, drop, keep)?.contiguous()?.detach(),
                    v_all.narrow(2, drop, keep)?.contiguous()?.detach(),
                ));
                self.first_slot[layer] = first + drop;
            }
        }
        Ok((k_all, v_all, first))
    }

    /// Appends this step's keys and values for `layer` and returns the full (past + new)
    /// keys and values to attend over.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| ModelError::InvalidArgument(format!("KvCache has no layer {layer}")))?;
        let (k_all, v_all) = match slot.take() {
            Some((k_past, v_past)) => (
                Tensor::cat(&[&k_past, k], 2)?,
                Tensor::cat(&[&v_past, v], 2)?,
            ),
            None => (k.clone(), v.clone()),
        };
        *slot = Some((k_all.detach(), v_all.detach()));
        Ok((k_all, v_all))
    }
}
