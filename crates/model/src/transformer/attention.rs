//! Grouped-query self-attention (`SelfAttention`: q/k/v/o projections with optional biases,
//! per-head or whole-projection q/k RMSNorm, OLMoE's q/k/v clamp, RoPE or NoPE per layer, full or
//! sliding-window keys, Gemma's scale and soft-cap, AFMoE's output gate) and `Attention`, the
//! choice between it and multi-head latent attention (`mla`).
//!
//! What it is not: the attention kernel (`stoke_ops::attention`, `attention_with`) or the mask
//! (the caller's bias, see mask.rs; the sliding window's part is built once per pass in
//! `forward`). It keeps no state: keys and values go to the `KvCache` the caller passes.
//!
//! Invariants: queries and keys are rotated in the [B, T, H, D] layout before the heads move
//! first; a sliding layer's cache returns only the window's keys and the bias is narrowed to
//! match; the per-head max logits (MuonClip) are recorded before any soft-cap and without a
//! gradient.

use super::context::ForwardContext;
use super::linear::Linear;
use super::mla::{LatentAttention, LatentQuery};
use super::ops::model_rms_norm;
use crate::error::ModelError;
use crate::kv_cache::KvCache;
use candle_core::{DType, Tensor};
use stoke_ops::{apply_rope, attention, attention_with};

#[derive(Debug, Clone)]
pub(crate) struct SelfAttention {
    pub(crate) q_proj: Linear,
    pub(crate) k_proj: Linear,
    pub(crate) v_proj: Linear,
    pub(crate) o_proj: Linear,
    pub(crate) q_norm: Option<Tensor>,
    pub(crate) k_norm: Option<Tensor>,
    /// Gated attention (AFMoE): the output times `sigmoid(gate_proj(x))` before `o_proj`.
    pub(crate) gate_proj: Option<Linear>,
}

/// A layer's attention: grouped-query (q/k/v projections) or latent (MLA).
#[derive(Debug, Clone)]
pub(crate) enum Attention {
    Standard(Box<SelfAttention>),
    Latent(Box<LatentAttention>),
}

impl Attention {
    /// The grouped-query attention (the fused CPU paths run only that one).
    pub(crate) fn standard(&self) -> Option<&SelfAttention> {
        match self {
            Attention::Standard(a) => Some(a),
            Attention::Latent(_) => None,
        }
    }

    /// Norm weights inside the attention (q/k norms, MLA's latent norms).
    pub(super) fn norms(&self) -> Vec<&Tensor> {
        match self {
            Attention::Standard(a) => a.q_norm.iter().chain(a.k_norm.iter()).collect(),
            Attention::Latent(l) => {
                let mut out = vec![&l.kv_a_layernorm];
                if let LatentQuery::LowRank { q_a_layernorm, .. } = &l.query {
                    out.push(q_a_layernorm);
                }
                out
            }
        }
    }

    pub(super) fn norms_mut(&mut self) -> Vec<&mut Tensor> {
        match self {
            Attention::Standard(a) => a.q_norm.iter_mut().chain(a.k_norm.iter_mut()).collect(),
            Attention::Latent(l) => {
                let mut out = vec![&mut l.kv_a_layernorm];
                if let LatentQuery::LowRank { q_a_layernorm, .. } = &mut l.query {
                    out.push(q_a_layernorm);
                }
                out
            }
        }
    }

    /// The linear layers with their module names (`self_attn.q_proj`, ...).
    pub(super) fn named_linears(&self) -> Vec<(String, &Linear)> {
        match self {
            Attention::Standard(a) => {
                let mut out: Vec<(String, &Linear)> = vec![
                    ("self_attn.q_proj".into(), &a.q_proj),
                    ("self_attn.k_proj".into(), &a.k_proj),
                    ("self_attn.v_proj".into(), &a.v_proj),
                    ("self_attn.o_proj".into(), &a.o_proj),
                ];
                if let Some(gate) = &a.gate_proj {
                    out.push(("self_attn.gate_proj".into(), gate));
                }
                out
            }
            Attention::Latent(l) => {
                let mut out: Vec<(String, &Linear)> = match &l.query {
                    LatentQuery::Direct(q) => vec![("self_attn.q_proj".into(), q)],
                    LatentQuery::LowRank {
                        q_a_proj, q_b_proj, ..
                    } => vec![
                        ("self_attn.q_a_proj".into(), q_a_proj),
                        ("self_attn.q_b_proj".into(), q_b_proj),
                    ],
                };
                out.extend([
                    ("self_attn.kv_a_proj_with_mqa".into(), &l.kv_a_proj_with_mqa),
                    ("self_attn.kv_b_proj".into(), &l.kv_b_proj),
                    ("self_attn.o_proj".into(), &l.o_proj),
                ]);
                out
            }
        }
    }

    pub(super) fn named_linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        match self {
            Attention::Standard(a) => {
                let mut out: Vec<(String, &mut Linear)> = vec![
                    ("self_attn.q_proj".into(), &mut a.q_proj),
                    ("self_attn.k_proj".into(), &mut a.k_proj),
                    ("self_attn.v_proj".into(), &mut a.v_proj),
                    ("self_attn.o_proj".into(), &mut a.o_proj),
                ];
                if let Some(gate) = &mut a.gate_proj {
                    out.push(("self_attn.gate_proj".into(), gate));
                }
                out
            }
            Attention::Latent(l) => {
                let mut out: Vec<(String, &mut Linear)> = match &mut l.query {
                    LatentQuery::Direct(q) => vec![("self_attn.q_proj".into(), q)],
                    LatentQuery::LowRank {
                        q_a_proj, q_b_proj, ..
                    } => vec![
                        ("self_attn.q_a_proj".into(), q_a_proj),
                        ("self_attn.q_b_proj".into(), q_b_proj),
                    ],
                };
                out.extend([
                    (
                        "self_attn.kv_a_proj_with_mqa".into(),
                        &mut l.kv_a_proj_with_mqa,
                    ),
                    ("self_attn.kv_b_proj".into(), &mut l.kv_b_proj),
                    ("self_attn.o_proj".into(), &mut l.o_proj),
                ]);
                out
            }
        }
    }

    pub(super) fn forward(
        &self,
        x: &Tensor,
        context: &ForwardContext,
        index: usize,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        match self {
            Attention::Standard(a) => a.forward(x, context, index, cache),
            Attention::Latent(l) => l.forward(x, context, index, cache),
        }
    }
}

impl SelfAttention {
    pub(super) fn forward(
        &self,
        x: &Tensor,
        context: &ForwardContext,
        index: usize,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        let config = &context.config;
        let (batch, len, width) = x.dims3()?;
        let (q_heads, kv_heads, head_dim) = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        );
        let x = x.reshape((batch * len, width))?;
        let (eps, offset) = (config.rms_norm_eps, config.norm_unit_offset);
        let mut q = self.q_proj.forward(&x, context.precision)?;
        let mut k = self.k_proj.forward(&x, context.precision)?;
        let mut v = self.v_proj.forward(&x, context.precision)?;
        if let (true, Some(qn), Some(kn)) = (config.qk_norm_whole, &self.q_norm, &self.k_norm) {
            // OLMoE: one norm over the whole projection, before the split into heads.
            q = model_rms_norm(&q, qn, eps, offset)?;
            k = model_rms_norm(&k, kn, eps, offset)?;
        }
        if let Some(c) = config.clip_qkv {
            q = q.clamp(-c, c)?;
            k = k.clamp(-c, c)?;
            v = v.clamp(-c, c)?;
        }
        let q = q.reshape((batch, len, q_heads, head_dim))?;
        let k = k.reshape((batch, len, kv_heads, head_dim))?;
        let v = v.reshape((batch, len, kv_heads, head_dim))?;
        let (q, k) = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) if !config.qk_norm_whole => (
                model_rms_norm(&q, qn, eps, offset)?,
                model_rms_norm(&k, kn, eps, offset)?,
            ),
            _ => (q, k),
        };
        // RoPE in the [B, T, H, D] layout (cos/sin are [B, T, 1, D]), then heads first; NoPE
        // layers skip it.
        let window = config.window_of(index);
        let (q, k) = if config.uses_rope(index) {
            let (cos, sin) = match (&context.local_cos_sin, window) {
                (Some((cos, sin)), Some(_)) => (cos, sin),
                _ => (&context.cos, &context.sin),
            };
            (apply_rope(&q, cos, sin)?, apply_rope(&k, cos, sin)?)
        } else {
            (q, k)
        };
        let q = q.transpose(1, 2)?.contiguous()?;
        let k = k.transpose(1, 2)?.contiguous()?;
        let v = v.transpose(1, 2)?.contiguous()?;
        let bias = match (window, &context.window_bias) {
            (Some(_), Some(window_bias)) => window_bias,
            _ => &context.bias,
        };
        let (k, v, bias) = match cache {
            Some(cache) => {
                // A sliding layer's cache keeps only the window: the keys returned start at
                // slot `first`, so the bias loses its columns before that.
                let slot = index - context.cache_offset;
                let (k, v, first) = cache.append_windowed(slot, &k, &v, window)?;
                let keys = k.dim(2)?;
                (k, v, bias.narrow(3, first, keys)?)
            }
            None => (k, v, bias.clone()),
        };
        if let Some(sink) = &context.max_logits {
            let per_head = max_logits_per_head(&q, &k, &bias, config.attention_scale())?;
            sink.lock()
                .map_err(|_| ModelError::InvalidArgument("logit record poisoned".into()))?
                .push((index, per_head));
        }
        let out = if config.is_plain() {
            attention(&q, &k, &v, &bias)?
        } else {
            attention_with(
                &q,
                &k,
                &v,
                &bias,
                config.attention_scale(),
                config.attn_logit_softcap,
            )?
        };
        let out = out
            .transpose(1, 2)?
            .reshape((batch * len, q_heads * head_dim))?;
        let out = match &self.gate_proj {
            Some(gate) => {
                (out * stoke_ops::logistic::sigmoid(&gate.forward(&x, context.precision)?)?)?
            }
            None => out,
        };
        Ok(self
            .o_proj
            .forward(&out, context.precision)?
            .reshape((batch, len, width))?)
    }
}

/// Each query head's largest logit `q·k * scale` over the keys `bias` allows (finite entries);
/// `q` [B, Hq, T, D], `k` [B, Hkv, Tk, D] (GQA groups contiguous, as `attention`), `bias`
/// broadcastable to [B, 1, T, Tk]. No gradient.
fn max_logits_per_head(
    q: &Tensor,
    k: &Tensor,
    bias: &Tensor,
    scale: f64,
) -> candle_core::Result<Vec<f32>> {
    let (batch, q_heads, q_len, head_dim) = q.dims4()?;
    let (_, kv_heads, k_len, _) = k.dims4()?;
    let n_rep = q_heads / kv_heads.max(1);
    let scores = q
        .detach()
        .contiguous()?
        .reshape((batch, kv_heads, n_rep * q_len, head_dim))?
        .matmul(&k.detach().t()?)?
        .reshape((batch, q_heads, q_len, k_len))?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let allowed: Vec<f32> = bias
        .detach()
        .to_dtype(DType::F32)?
        .broadcast_as((batch, 1, q_len, k_len))?
        .flatten_all()?
        .to_vec1()?;
    let mut out = vec![f32::NEG_INFINITY; q_heads];
    let block = q_len * k_len;
    for b in 0..batch {
        for (h, best) in out.iter_mut().enumerate() {
            let head = &scores[(b * q_heads + h) * block..(b * q_heads + h + 1) * block];
            let mask = &allowed[b * block..(b + 1) * block];
            for (s, m) in head.iter().zip(mask) {
                if m.is_finite() && *s > *best {
                    *best = *s;
                }
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|m| (f64::from(m) * scale) as f32)
        .collect())
}
