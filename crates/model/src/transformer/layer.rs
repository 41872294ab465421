//! A decoder layer (`DecoderLayer`: norm -> attention -> residual -> norm -> MLP -> residual,
//! with Gemma/AFMoE sandwich norms where the config has them) and DeepSeek-V3's multi-token
//! prediction module around one (`MtpModule`).
//!
//! What it is not: the fused form of the layer (`fused_block`, one graph node with a
//! hand-written backward) or the loop over layers (`forward`).
//!
//! Invariants: `named_linears` lists the layer's linear layers under their checkpoint module
//! names, attention first, in one order that `named_linears_mut`, `linears` and `linears_mut`
//! share (LoRA and packing rely on it); routers and the shared-expert gate are not linear layers
//! here; `vars` lists exactly the variables the layer reads.

use super::attention::Attention;
use super::context::ForwardContext;
use super::linear::Linear;
use super::mlp::Mlp;
use super::ops::model_rms_norm;
use crate::error::ModelError;
use crate::hf_names::ExpertNames;
use crate::kv_cache::KvCache;
use candle_core::Tensor;

#[derive(Debug, Clone)]
pub(crate) struct DecoderLayer {
    pub(crate) input_layernorm: Tensor,
    pub(crate) self_attn: Attention,
    /// Pre-MLP norm; with sandwich norms, the norm of the attention output instead.
    pub(crate) post_attention_layernorm: Tensor,
    /// Sandwich norms only: the MLP's input and output norms.
    pub(crate) pre_feedforward_layernorm: Option<Tensor>,
    pub(crate) post_feedforward_layernorm: Option<Tensor>,
    pub(crate) mlp: Mlp,
}

/// A multi-token prediction module (DeepSeek-V3 §2.2, transformers' `MtpLayer`): at position
/// i, `post_norm(block(eh_proj([enorm(emb(t_{i+1})), hnorm(h_i)])))`, where `h_i` is the main
/// model's final-normed hidden state (or the previous module's output), predicts `t_{i+2}`
/// through the model's LM head.
#[derive(Debug, Clone)]
pub(crate) struct MtpModule {
    pub(crate) enorm: Tensor,
    pub(crate) hnorm: Tensor,
    pub(crate) eh_proj: Linear,
    pub(crate) block: DecoderLayer,
    /// The checkpoint's `shared_head.norm`.
    pub(crate) post_norm: Tensor,
}

impl DecoderLayer {
    /// Every variable the block reads (norms, linear weights, biases and adapters, q/k norms);
    /// frozen tensors are not variables and are left out.
    pub(super) fn vars(&self) -> Vec<Tensor> {
        let norms = [&self.input_layernorm, &self.post_attention_layernorm]
            .into_iter()
            .chain(self.pre_feedforward_layernorm.iter())
            .chain(self.post_feedforward_layernorm.iter())
            .chain(self.self_attn.norms())
            .chain(self.routing_tensors())
            .filter(|t| t.is_variable());
        let linears = self.linears().into_iter().flat_map(Linear::tracked);
        norms.chain(linears).cloned().collect()
    }

    /// Detaches every base tensor of the block (LoRA: no gradient reaches the base).
    pub(super) fn freeze(&mut self) {
        for t in [
            &mut self.input_layernorm,
            &mut self.post_attention_layernorm,
        ]
        .into_iter()
        .chain(self.pre_feedforward_layernorm.iter_mut())
        .chain(self.post_feedforward_layernorm.iter_mut())
        .chain(self.self_attn.norms_mut())
        {
            *t = t.detach();
        }
        if let Mlp::Moe(block) = &mut self.mlp {
            block.router = block.router.detach();
            if let Some((_, Some(gate))) = &mut block.shared {
                *gate = gate.detach();
            }
        }
        for linear in self.linears_mut() {
            linear.weight = linear.weight.detach();
            linear.bias = linear.bias.as_ref().map(Tensor::detach);
        }
    }

    /// Every linear layer of the block with its module name within the layer (checkpoint
    /// naming: `self_attn.q_proj`, `mlp.gate_proj`, `mlp.experts.3.up_proj`, ...), attention
    /// first. Routers and the shared-expert gate are not linear layers here (no adapters, no
    /// packing: routing stays in f32).
    pub(crate) fn named_linears(&self) -> Vec<(String, &Linear)> {
        let mut out = self.self_attn.named_linears();
        match &self.mlp {
            Mlp::SwiGlu {
                gate_proj,
                up_proj,
                down_proj,
            } => out.extend([
                ("mlp.gate_proj".into(), gate_proj),
                ("mlp.up_proj".into(), up_proj),
                ("mlp.down_proj".into(), down_proj),
            ]),
            Mlp::Moe(block) => {
                let names = ExpertNames::of(block.naming);
                for (e, expert) in block.experts.iter().enumerate() {
                    let [gate, up, down] = names.expert(e);
                    out.extend([(gate, &expert.gate), (up, &expert.up), (down, &expert.down)]);
                }
                if let Some((shared, _)) = &block.shared {
                    let base = names.shared().0;
                    out.extend([
                        (format!("{base}.gate_proj"), &shared.gate),
                        (format!("{base}.up_proj"), &shared.up),
                        (format!("{base}.down_proj"), &shared.down),
                    ]);
                }
            }
        }
        out
    }

    /// `named_linears`, mutable, in the same order.
    pub(crate) fn named_linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out = self.self_attn.named_linears_mut();
        match &mut self.mlp {
            Mlp::SwiGlu {
                gate_proj,
                up_proj,
                down_proj,
            } => out.extend([
                ("mlp.gate_proj".into(), gate_proj),
                ("mlp.up_proj".into(), up_proj),
                ("mlp.down_proj".into(), down_proj),
            ]),
            Mlp::Moe(block) => {
                let names = ExpertNames::of(block.naming);
                for (e, expert) in block.experts.iter_mut().enumerate() {
                    let [gate, up, down] = names.expert(e);
                    out.extend([
                        (gate, &mut expert.gate),
                        (up, &mut expert.up),
                        (down, &mut expert.down),
                    ]);
                }
                if let Some((shared, _)) = &mut block.shared {
                    let base = names.shared().0;
                    out.extend([
                        (format!("{base}.gate_proj"), &mut shared.gate),
                        (format!("{base}.up_proj"), &mut shared.up),
                        (format!("{base}.down_proj"), &mut shared.down),
                    ]);
                }
            }
        }
        out
    }

    pub(crate) fn linears(&self) -> Vec<&Linear> {
        self.named_linears().into_iter().map(|(_, l)| l).collect()
    }

    pub(crate) fn linears_mut(&mut self) -> Vec<&mut Linear> {
        self.named_linears_mut()
            .into_iter()
            .map(|(_, l)| l)
            .collect()
    }

    /// The MoE block's tensors that are not linear layers: the router and the shared-expert gate.
    fn routing_tensors(&self) -> Vec<&Tensor> {
        match &self.mlp {
            Mlp::Moe(block) => std::iter::once(&block.router)
                .chain(block.shared.iter().filter_map(|(_, gate)| gate.as_ref()))
                .chain(block.checkpoint_bias.iter())
                .collect(),
            Mlp::SwiGlu { .. } => Vec::new(),
        }
    }

    pub(super) fn forward(
        &self,
        hidden: &Tensor,
        context: &ForwardContext,
        index: usize,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        let config = &context.config;
        let (eps, offset) = (config.rms_norm_eps, config.norm_unit_offset);
        let norm = |x: &Tensor, w: &Tensor| model_rms_norm(x, w, eps, offset);
        let normed = norm(hidden, &self.input_layernorm)?;
        let attn_out = self.self_attn.forward(&normed, context, index, cache)?;
        let (hidden, normed) = match (
            &self.pre_feedforward_layernorm,
            &self.post_feedforward_layernorm,
        ) {
            // Sandwich: the attention output is normed before the residual add.
            (Some(pre_ffn), Some(_)) => {
                let hidden = (hidden + norm(&attn_out, &self.post_attention_layernorm)?)?;
                let normed = norm(&hidden, pre_ffn)?;
                (hidden, normed)
            }
            _ => {
                let hidden = (hidden + attn_out)?;
                let normed = norm(&hidden, &self.post_attention_layernorm)?;
                (hidden, normed)
            }
        };
        let (batch, len, width) = normed.dims3()?;
        let (mlp_out, routing) = self.mlp.forward(
            &normed.reshape((batch * len, width))?,
            context.precision,
            config.hidden_act,
            index,
        )?;
        if let (Some(routing), Some(sink)) = (routing, &context.routings) {
            sink.lock()
                .map_err(|_| ModelError::InvalidArgument("routing record poisoned".into()))?
                .push(routing);
        }
        let mlp_out = mlp_out.reshape((batch, len, width))?;
        let mlp_out = match &self.post_feedforward_layernorm {
            Some(post_ffn) => norm(&mlp_out, post_ffn)?,
            None => mlp_out,
        };
        Ok((hidden + mlp_out)?)
    }
}
