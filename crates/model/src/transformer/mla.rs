//! Multi-head latent attention (DeepSeek-V2/V3, `MlaConfig`): queries direct or through a
//! normed low-rank bottleneck, keys and values from one normed latent per token plus one shared
//! rotated key.
//!
//! What it is not: grouped-query attention (`attention`), and it records no per-head max logits
//! (MuonClip asks for them and is refused by name).
//!
//! Invariants: without a cache the latent is expanded into every head's keys and values; with
//! one, the cache holds the normed latent and the rotated shared key only, and attention runs in
//! the latent space with the absorbed weights (`W_uk`, `W_uv` of `kv_b_proj`, adapters merged):
//! the same sums in another order. The inner norms use eps 1e-6 whatever `rms_norm_eps` says.

use super::context::ForwardContext;
use super::linear::Linear;
use crate::error::ModelError;
use crate::kv_cache::KvCache;
use candle_core::Tensor;
use stoke_ops::{apply_rope, attention_with, rms_norm};

/// The eps of MLA's inner norms: DeepseekV3Attention builds `q_a_layernorm` and
/// `kv_a_layernorm` with the RMSNorm default, not `rms_norm_eps`.
const LATENT_NORM_EPS: f64 = 1e-6;

/// Multi-head latent attention (DeepSeek-V2/V3; see `MlaConfig`).
#[derive(Debug, Clone)]
pub(crate) struct LatentAttention {
    pub(crate) query: LatentQuery,
    /// `x -> [latent (kv_lora_rank), shared rotated key (qk_rope_head_dim)]`.
    pub(crate) kv_a_proj_with_mqa: Linear,
    pub(crate) kv_a_layernorm: Tensor,
    /// `latent -> per head [unrotated key (qk_nope_head_dim), value (v_head_dim)]`.
    pub(crate) kv_b_proj: Linear,
    pub(crate) o_proj: Linear,
}

/// MLA's query projection: direct, or low-rank through a normed bottleneck.
#[derive(Debug, Clone)]
pub(crate) enum LatentQuery {
    Direct(Linear),
    LowRank {
        q_a_proj: Linear,
        q_a_layernorm: Tensor,
        q_b_proj: Linear,
    },
}

impl LatentAttention {
    /// MLA as DeepseekV3Attention computes it. Without a cache (training, scoring) the latent is
    /// expanded into every head's keys and values. With one, the cache stores the normed latent
    /// and the rotated shared key, and attention runs in the latent space with the absorbed
    /// weights: each head's unrotated query is multiplied into the latent by its slice of
    /// `kv_b_proj` (W_uk), scores are `q_lat · latent + q_rot · k_rot`, and the attended
    /// latent leaves through the head's value slice (W_uv). Both are the same sums in a
    /// different order.
    pub(super) fn forward(
        &self,
        x: &Tensor,
        context: &ForwardContext,
        index: usize,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        let config = &context.config;
        let Some(mla) = &config.mla else {
            return Err(ModelError::InvalidArgument(
                "latent attention without an MLA config".into(),
            ));
        };
        if context.max_logits.is_some() {
            return Err(ModelError::InvalidArgument(
                "per-head max attention logits (MuonClip) are not recorded for latent attention"
                    .into(),
            ));
        }
        let p = context.precision;
        let (batch, len, width) = x.dims3()?;
        let heads = config.num_attention_heads;
        let (nope, rope, v_dim, rank) = (
            mla.qk_nope_head_dim,
            mla.qk_rope_head_dim,
            mla.v_head_dim,
            mla.kv_lora_rank,
        );
        let x = x.reshape((batch * len, width))?;
        let q = match &self.query {
            LatentQuery::Direct(q_proj) => q_proj.forward(&x, p)?,
            LatentQuery::LowRank {
                q_a_proj,
                q_a_layernorm,
                q_b_proj,
            } => {
                let low = rms_norm(&q_a_proj.forward(&x, p)?, q_a_layernorm, LATENT_NORM_EPS)?;
                q_b_proj.forward(&low, p)?
            }
        };
        let q = q.reshape((batch, len, heads, nope + rope))?;
        let q_nope = q.narrow(3, 0, nope)?;
        let q_rot = q.narrow(3, nope, rope)?;
        let compressed = self.kv_a_proj_with_mqa.forward(&x, p)?;
        let latent = rms_norm(
            &compressed.narrow(1, 0, rank)?.contiguous()?,
            &self.kv_a_layernorm,
            LATENT_NORM_EPS,
        )?;
        let k_rot = compressed
            .narrow(1, rank, rope)?
            .reshape((batch, len, 1, rope))?;
        // DeepSeek's rotary pairs are interleaved (x0, x1), (x2, x3), ...: gathering the even
        // dims then the odd ones makes them halves, where the usual rotation applies (and its
        // output is laid out as transformers' apply_rotary_pos_emb_interleave writes it).
        let (q_rot, k_rot) = if mla.rope_interleave {
            let order: Vec<u32> = (0..rope as u32)
                .step_by(2)
                .chain((1..rope as u32).step_by(2))
                .collect();
            let order = Tensor::from_vec(order, rope, x.device())?;
            (
                q_rot.contiguous()?.index_select(&order, 3)?,
                k_rot.contiguous()?.index_select(&order, 3)?,
            )
        } else {
            (q_rot, k_rot)
        };
        let q_rot = apply_rope(&q_rot.contiguous()?, &context.cos, &context.sin)?;
        let k_rot = apply_rope(&k_rot.contiguous()?, &context.cos, &context.sin)?;
        // Heads first: [B, H, T, *]; the latent and shared key have one head.
        let q_nope = q_nope.transpose(1, 2)?.contiguous()?;
        let q_rot = q_rot.transpose(1, 2)?.contiguous()?;
        let k_rot = k_rot.transpose(1, 2)?.contiguous()?;
        let latent = latent
            .reshape((batch, len, 1, rank))?
            .transpose(1, 2)?
            .contiguous()?;
        let scale = config.attention_scale();
        let out = match cache {
            None => {
                // Expanded: per head keys [k_nope, k_rot] and values from the latent.
                let kv = self
                    .kv_b_proj
                    .forward(&latent.reshape((batch * len, rank))?, p)?
                    .reshape((batch, len, heads, nope + v_dim))?
                    .transpose(1, 2)?;
                let k_nope = kv.narrow(3, 0, nope)?;
                let v = kv.narrow(3, nope, v_dim)?.contiguous()?;
                let k = Tensor::cat(
                    &[&k_nope, &k_rot.broadcast_as((batch, heads, len, rope))?],
                    3,
                )?;
                let q = Tensor::cat(&[&q_nope, &q_rot], 3)?;
                attention_with(&q, &k, &v, &context.bias, scale, None)?
            }
            Some(cache) => {
                let slot = index - context.cache_offset;
                let (latent_all, k_rot_all) = cache.append(slot, &latent, &k_rot)?;
                let keys = latent_all.dim(2)?;
                // kv_b_proj's weight per head: [H, nope + v, rank] -> W_uk, W_uv.
                let w = self
                    .kv_b_proj
                    .effective_weight()?
                    .reshape((heads, nope + v_dim, rank))?;
                // W_uk^T per head [H, rank, nope], and W_uv [H, v, rank]: both as rows the
                // per-head products read (`stoke_ops::linear::per_head_linear`).
                let w_uk_t = w.narrow(1, 0, nope)?.transpose(1, 2)?.contiguous()?;
                let w_uv = w.narrow(1, nope, v_dim)?.contiguous()?;
                // [H, B*T, nope] x [H, nope, rank] -> q in the latent space, [B, H, T, rank].
                let q_lat = stoke_ops::linear::per_head_linear(
                    &q_nope
                        .transpose(0, 1)?
                        .contiguous()?
                        .reshape((heads, batch * len, nope))?,
                    &w_uk_t,
                )?
                .reshape((heads, batch, len, rank))?
                .transpose(0, 1)?;
                let q = Tensor::cat(&[&q_lat, &q_rot], 3)?;
                let k = Tensor::cat(&[&latent_all, &k_rot_all], 3)?;
                let bias = context.bias.narrow(3, 0, keys)?;
                let attended = attention_with(&q, &k, &latent_all, &bias, scale, None)?;
                // [H, B*T, rank] x [H, rank, v] -> [B, H, T, v].
                stoke_ops::linear::per_head_linear(
                    &attended
                        .transpose(0, 1)?
                        .contiguous()?
                        .reshape((heads, batch * len, rank))?,
                    &w_uv,
                )?
                .reshape((heads, batch, len, v_dim))?
                .transpose(0, 1)?
            }
        };
        let out = out
            .transpose(1, 2)?
            .contiguous()?
            .reshape((batch * len, heads * v_dim))?;
        Ok(self.o_proj.forward(&out, p)?.reshape((batch, len, width))?)
    }
}
