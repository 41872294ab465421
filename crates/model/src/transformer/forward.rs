//! The forward pass: five entry points over one loop (`forward` -> logits, `forward_hidden`,
//! `forward_hidden_routed`, `forward_hidden_recorded`, all through `forward_hidden_full`), the
//! multi-token prediction modules' pass (`mtp_hidden`), and the LM head (`lm_logits`). A
//! classifier's head is `classifier`'s.
//!
//! The loop: check the shapes (ids, positions, bias, cache); build the RoPE tables, the biases
//! (and the sliding window's) and the record sinks once (`ForwardContext`); embed (scaled for
//! Gemma); run each layer as a fused node (training/scoring, or a prompt's prefill), as a
//! checkpointed block, or as the op composition; take the records; final norm.
//!
//! What it is not: stateful. The KV cache, positions and attention bias come from the caller
//! (see mask.rs); the fused decode step is `crate::decode`. No dropout.
//!
//! Invariants: an inference copy runs only in bf16; a recorded MoE layer is not checkpointed
//! (its router logits stay in the graph) and recording max logits turns the fused block off.

use super::context::{ForwardContext, ForwardRecord, Record};
use super::fused_block::{self, FusedInputs};
use super::mlp::Mlp;
use super::model::Transformer;
use super::ops::model_rms_norm;
use crate::activation_checkpoint::checkpointed;
use crate::error::ModelError;
use crate::kv_cache::KvCache;
use crate::moe::Routing;
use candle_core::{DType, Tensor};
use std::sync::Arc;
use stoke_ops::{Precision, rms_norm};

impl Transformer {
    /// Logits [B, T, vocab] for `input_ids` [B, T] (u32) at `positions` [B, T] (u32) under the
    /// additive `attn_bias` [B, 1, T, T_past + T]. With a cache, this step's keys/values are
    /// appended and attention covers cached + new slots.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        attn_bias: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        let hidden = self.forward_hidden(input_ids, positions, attn_bias, cache)?;
        self.lm_logits(&hidden)
    }

    /// The final-normed hidden states [B, T, hidden] (what `forward` feeds the LM head);
    /// lets generation compute logits for the last position only.
    pub fn forward_hidden(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        attn_bias: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        let record = Record::default();
        Ok(self
            .forward_hidden_full(input_ids, positions, attn_bias, cache, record)?
            .0)
    }

    /// `forward_hidden`, plus what every MoE layer routed, in layer order (empty for a dense
    /// model): the router logits in the autograd graph (for the auxiliary loss) and the experts
    /// chosen (for the load statistics and the bias rules). MoE layers are not checkpointed in
    /// a recorded pass (their router logits stay in the graph).
    pub fn forward_hidden_routed(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        attn_bias: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Result<(Tensor, Vec<Routing>), ModelError> {
        let record = Record {
            routing: true,
            max_logits: false,
        };
        let (hidden, record) =
            self.forward_hidden_full(input_ids, positions, attn_bias, cache, record)?;
        Ok((hidden, record.routings))
    }

    /// `forward_hidden` with the records `record` asks for: the MoE routing (as
    /// `forward_hidden_routed`) and each attention layer's per-query-head largest logit
    /// (`q·k` times the attention scale, before any soft-cap, over the keys the mask allows),
    /// which MuonClip needs. Recording max logits runs every layer through the op composition
    /// (the fused block does not expose its scores).
    pub fn forward_hidden_recorded(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        attn_bias: &Tensor,
        record: Record,
    ) -> Result<(Tensor, ForwardRecord), ModelError> {
        self.forward_hidden_full(input_ids, positions, attn_bias, None, record)
    }

    fn forward_hidden_full(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        attn_bias: &Tensor,
        mut cache: Option<&mut KvCache>,
        record: Record,
    ) -> Result<(Tensor, ForwardRecord), ModelError> {
        let record_routing = record.routing;
        if self.precision != Precision::Bf16 {
            self.refuse_inference_only("a forward pass in f32 precision")?;
        }
        let (batch, len) = input_ids.dims2()?;
        if positions.dims() != [batch, len] {
            return Err(ModelError::InvalidArgument(format!(
                "positions have shape {:?}, input_ids {:?}",
                positions.dims(),
                input_ids.dims()
            )));
        }
        let past = match cache.as_deref() {
            Some(c) if c.num_layers() != self.layers.len() => {
                return Err(ModelError::InvalidArgument(format!(
                    "KvCache has {} layers, model {}",
                    c.num_layers(),
                    self.layers.len()
                )));
            }
            Some(c) => c.len(),
            None => 0,
        };
        let bias_dims = attn_bias.dims();
        if bias_dims.len() != 4
            || (bias_dims[0] != batch && bias_dims[0] != 1)
            || bias_dims[2] != len
            || bias_dims[3] != past + len
        {
            return Err(ModelError::InvalidArgument(format!(
                "attn_bias has shape {bias_dims:?}, expected [{batch}, 1, {len}, {}]",
                past + len
            )));
        }
        let dtype = self.dtype();
        let (cos, sin) = self.rotary.cos_sin(positions, dtype)?;
        let cos = cos.to_device(self.device())?;
        let sin = sin.to_device(self.device())?;
        let local_cos_sin = match &self.local_rotary {
            Some(table) => {
                let (cos, sin) = table.cos_sin(positions, dtype)?;
                Some((cos.to_device(self.device())?, sin.to_device(self.device())?))
            }
            None => None,
        };
        let bias = attn_bias.to_dtype(dtype)?;
        // The sliding layers' bias: keys at `window` or more positions before the query are
        // masked too. Key positions are the cache's (every slot processed so far) and this
        // step's.
        let key_positions = match cache.as_deref_mut() {
            Some(cache) if self.config.sliding_window.is_some() => {
                Some(cache.record_positions(positions)?)
            }
            _ => None,
        };
        let window_bias = match self.config.sliding_window {
            Some(window) => {
                let keys = key_positions.as_ref().unwrap_or(positions);
                let combined = crate::mask::sliding_window_bias(&bias, positions, keys, window)?;
                Some(combined.to_dtype(dtype)?)
            }
            None => None,
        };
        let plain = self.config.is_plain();
        // The fused block runs training and scoring (no cache) and a prompt's prefill (an empty
        // cache, filled with the keys and values it returns).
        let prefill = cache.as_deref().is_some_and(KvCache::is_empty);
        let fused = match cache {
            _ if !plain => None,
            None if self.fused_blocks
                && self.device().is_cpu()
                && matches!(dtype, DType::F32 | DType::F64) =>
            {
                Some(Arc::new(FusedInputs::new(&cos, &sin, &bias)?))
            }
            Some(_)
                if prefill
                    && self.fused_blocks
                    && self.device().is_cpu()
                    && matches!(dtype, DType::F32 | DType::F64) =>
            {
                Some(Arc::new(FusedInputs::new(&cos, &sin, &bias)?))
            }
            _ => None,
        };
        let context = Arc::new(ForwardContext {
            config: Arc::new(self.config.clone()),
            cos,
            sin,
            local_cos_sin,
            bias,
            window_bias,
            routings: record_routing.then(|| std::sync::Mutex::new(Vec::new())),
            max_logits: record.max_logits.then(|| std::sync::Mutex::new(Vec::new())),
            precision: self.precision,
            cache_offset: 0,
        });
        let fused = if record.max_logits { None } else { fused };
        let checkpointing =
            self.activation_checkpointing && cache.is_none() && self.device().is_cpu();
        let block_shape = stoke_ops::block::BlockShape {
            batch,
            len,
            hidden: self.config.hidden_size,
            q_heads: self.config.num_attention_heads,
            kv_heads: self.config.num_key_value_heads,
            head_dim: self.config.head_dim,
            intermediate: self.config.intermediate_size,
            rms_norm_eps: self.config.rms_norm_eps,
        };
        let ids = input_ids.to_dtype(DType::U32)?.flatten_all()?;
        let mut hidden = self.embed_tokens.index_select(&ids, 0)?.reshape((
            batch,
            len,
            self.config.hidden_size,
        ))?;
        if self.config.scale_embeddings {
            // Gemma: sqrt(hidden) as a float32 scalar, rounded to the parameters' dtype.
            let scale = (self.config.hidden_size as f64).sqrt() as f32;
            let scale = Tensor::new(scale, self.device())?.to_dtype(dtype)?;
            hidden = hidden.broadcast_mul(&scale)?;
        }
        for (index, layer) in self.layers.iter().enumerate() {
            let fused = fused
                .as_ref()
                .filter(|_| fused_block::applies(layer, &hidden));
            hidden = if let (Some(inputs), Some(cache)) = (fused, cache.as_deref_mut()) {
                // Prefill: the keys and values go to the cache; inference only, off the graph.
                let (y, k, v) = fused_block::forward_with_kv(
                    layer,
                    &hidden,
                    inputs,
                    block_shape,
                    self.precision,
                )?;
                cache.append(index, &k, &v)?;
                y
            } else if let Some(inputs) = fused {
                fused_block::forward(
                    layer,
                    &hidden,
                    inputs,
                    block_shape,
                    self.precision,
                    checkpointing,
                )?
            } else if checkpointing && !(record_routing && matches!(layer.mlp, Mlp::Moe(_))) {
                // (A recorded MoE layer is not checkpointed: its router logits must stay in the
                // graph for the auxiliary loss, and a recomputation would route twice.)
                let (block, ctx) = (layer.clone(), context.clone());
                let run = move |x: &Tensor| {
                    block
                        .forward(x, &ctx, index, None)
                        .map_err(candle_core::Error::wrap)
                };
                checkpointed(&hidden, &layer.vars(), Arc::new(run))?
            } else {
                layer.forward(&hidden, &context, index, cache.as_deref_mut())?
            };
        }
        let routings = match &context.routings {
            Some(sink) => std::mem::take(
                &mut *sink
                    .lock()
                    .map_err(|_| ModelError::InvalidArgument("routing record poisoned".into()))?,
            ),
            None => Vec::new(),
        };
        let max_logits = match &context.max_logits {
            Some(sink) => std::mem::take(
                &mut *sink
                    .lock()
                    .map_err(|_| ModelError::InvalidArgument("logit record poisoned".into()))?,
            ),
            None => Vec::new(),
        };
        let hidden = model_rms_norm(
            &hidden,
            &self.norm,
            self.config.rms_norm_eps,
            self.config.norm_unit_offset,
        )?;
        Ok((
            hidden,
            ForwardRecord {
                routings,
                max_logits,
            },
        ))
    }

    /// The number of multi-token prediction modules (DeepSeek-V3's `num_nextn_predict_layers`
    /// that the checkpoint carries).
    pub fn num_mtp_modules(&self) -> usize {
        self.mtp.len()
    }

    /// Multi-token prediction module `depth` (0 = the first, predicting two tokens ahead): its
    /// final-normed hidden states [B, T, hidden] (feed `lm_logits` for its logits).
    ///
    /// Entry i combines `previous[i]` (the main model's final-normed hidden state at i for
    /// depth 0, else the previous module's output) with the embedding of `next_ids[i]` (the
    /// token after position i, `t_{i+1}`), and predicts `t_{i+2+depth}`. `positions` and
    /// `attn_bias` [B, 1, T, T_past + T] describe the entries as `forward` does for tokens
    /// (transformers gives entry i the position of `t_{i+1}`). The cache, when given, is the
    /// modules' own (`KvCache::new(num_mtp_modules())`, slot `depth`).
    pub fn mtp_hidden(
        &self,
        depth: usize,
        previous: &Tensor,
        next_ids: &Tensor,
        positions: &Tensor,
        attn_bias: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        let module = self.mtp.get(depth).ok_or_else(|| {
            ModelError::InvalidArgument(format!(
                "mtp_hidden: depth {depth}, but the model has {} MTP module(s)",
                self.mtp.len()
            ))
        })?;
        let (batch, len) = next_ids.dims2()?;
        let width = self.config.hidden_size;
        if previous.dims() != [batch, len, width] || positions.dims() != [batch, len] {
            return Err(ModelError::InvalidArgument(format!(
                "mtp_hidden: previous {:?} and positions {:?} for next_ids {:?}",
                previous.dims(),
                positions.dims(),
                next_ids.dims()
            )));
        }
        if let Some(c) = cache.as_deref()
            && c.num_layers() != self.mtp.len()
        {
            return Err(ModelError::InvalidArgument(format!(
                "mtp_hidden: the cache has {} layers for {} MTP module(s)",
                c.num_layers(),
                self.mtp.len()
            )));
        }
        let dtype = self.dtype();
        let (cos, sin) = self.rotary.cos_sin(positions, dtype)?;
        let context = ForwardContext {
            config: Arc::new(self.config.clone()),
            cos: cos.to_device(self.device())?,
            sin: sin.to_device(self.device())?,
            local_cos_sin: None,
            bias: attn_bias.to_dtype(dtype)?,
            window_bias: None,
            routings: None,
            max_logits: None,
            precision: self.precision,
            cache_offset: self.config.num_hidden_layers,
        };
        let eps = self.config.rms_norm_eps;
        let ids = next_ids.to_dtype(DType::U32)?.flatten_all()?;
        let embedded = self
            .embed_tokens
            .index_select(&ids, 0)?
            .reshape((batch, len, width))?;
        let joined = Tensor::cat(
            &[
                &rms_norm(&embedded, &module.enorm, eps)?,
                &rms_norm(previous, &module.hnorm, eps)?,
            ],
            2,
        )?;
        let x = module
            .eh_proj
            .forward(&joined.reshape((batch * len, 2 * width))?, self.precision)?
            .reshape((batch, len, width))?;
        let index = self.config.num_hidden_layers + depth;
        let y = module.block.forward(&x, &context, index, cache)?;
        Ok(rms_norm(&y, &module.post_norm, eps)?)
    }

    /// LM head on hidden states [..., hidden] -> logits [..., vocab]. A classifier has none
    /// (an error).
    pub fn lm_logits(&self, hidden: &Tensor) -> Result<Tensor, ModelError> {
        if self.score.is_some() {
            return Err(ModelError::InvalidArgument(
                "a classifier (a reward model) has no LM head: it scores sequences or tokens \
                 (`sequence_scores`, `token_scores`), it does not generate"
                    .into(),
            ));
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        let dims = hidden.dims().to_vec();
        let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
        let flat = hidden.reshape((rows, self.config.hidden_size))?;
        let logits = match &self.packed_head {
            Some(packed) if stoke_ops::linear::uses_bf16(self.precision, &[&flat]) => {
                stoke_ops::linear::linear_prepacked(&flat, packed)?
            }
            _ => stoke_ops::linear(&flat, head, self.precision)?,
        };
        let mut out_dims = dims;
        if let Some(last) = out_dims.last_mut() {
            *last = self.config.vocab_size;
        }
        let logits = match self.config.final_logit_softcap {
            // Gemma 2: cap * tanh(logits / cap), part of the model's logits.
            Some(cap) => ((logits / cap)?.tanh()? * cap)?,
            None => logits,
        };
        Ok(logits.reshape(out_dims)?)
    }
}
