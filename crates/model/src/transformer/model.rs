//! The model (`Transformer`): its parameters by Hugging Face name, the modules built over them
//! (`assemble`), and what is done to a whole model: copies (`snapshot`, `to_dtype`,
//! `keep_layers`), freezing, precision and checkpointing switches, the MoE layers' balancing
//! bias and capacity.
//!
//! What it is not: the forward pass (`forward`), random initialisation (`init`), bf16 packing
//! for inference (`packing`), LoRA (`crate::lora`), or loading and saving (`crate::checkpoint`,
//! `crate::gguf`).
//!
//! Invariants: `parameters` holds exactly the names of `parameter_shapes(config)` (an inference
//! copy: those that are not linear weights); the modules read views of those variables (frozen:
//! detached views of the same storage); the parameter dtype is uniform.

use super::attention::{Attention, SelfAttention};
use super::layer::{DecoderLayer, MtpModule};
use super::linear::Linear;
use super::mla::{LatentAttention, LatentQuery};
use super::mlp::Mlp;
use super::moe_block::{Expert, MoeBlock};
use crate::config::{ModelConfig, ScoreKind};
use crate::error::ModelError;
use crate::hf_names::{
    EMBED_TOKENS, ExpertNames, FINAL_NORM, LM_HEAD, SCORE_BIAS, SCORE_HEAD, parameter_shapes,
    sandwich_names,
};
use crate::rotary::RotaryTable;
use candle_core::{DType, Device, Tensor, Var};
use std::collections::BTreeMap;
use std::sync::Arc;
use stoke_ops::Precision;
use stoke_ops::bf16::PackedA;

#[derive(Debug, Clone)]
pub struct Transformer {
    pub(super) config: ModelConfig,
    /// Every base parameter by HF name (the variables; under LoRA they are frozen: the layers
    /// read detached views, and `trainable_parameters` lists the adapters instead).
    pub(super) parameters: BTreeMap<String, Var>,
    pub(crate) embed_tokens: Tensor,
    pub(crate) layers: Vec<DecoderLayer>,
    /// Multi-token prediction modules (DeepSeek-V3), depth 1 first.
    pub(crate) mtp: Vec<MtpModule>,
    pub(crate) norm: Tensor,
    pub(crate) lm_head: Option<Tensor>,
    /// A classifier's head `[labels, hidden]` (`config.score_labels`), in place of the LM head.
    pub(crate) score: Option<Tensor>,
    /// A token classifier's head bias `[labels]` (`ScoreKind::Token { bias: true }`).
    pub(crate) score_bias: Option<Tensor>,
    /// LoRA adapters by PEFT name (`base_model.model.<module>.lora_A.weight`), with their config.
    pub(crate) lora: Option<(crate::lora::LoraConfig, BTreeMap<String, Var>)>,
    /// The LM head's weight packed in bf16 for inference (`pack_weights`).
    pub(crate) packed_head: Option<Arc<PackedA>>,
    pub(super) rotary: RotaryTable,
    /// The sliding-window layers' RoPE table when it differs from `rotary` (Gemma 3).
    pub(super) local_rotary: Option<RotaryTable>,
    /// How the linear layers and the LM head multiply (`Precision::F32` unless set).
    pub(super) precision: Precision,
    /// Recompute each block's activations in the backward pass (`set_activation_checkpointing`).
    pub(super) activation_checkpointing: bool,
    /// Layers run as one fused node where they can (`fused_block`); off: the op composition.
    pub(super) fused_blocks: bool,
    /// Made by `inference_copy`: linear layers only packed (their f32 weights are placeholders).
    pub(super) inference_only: bool,
}

impl Transformer {
    /// Builds the model from named tensors (exactly the names of `parameter_shapes`, any
    /// float dtype, all the same). Each tensor becomes a fresh `Var`.
    pub fn from_tensors(
        config: ModelConfig,
        tensors: BTreeMap<String, Tensor>,
    ) -> Result<Transformer, ModelError> {
        let mut parameters = BTreeMap::new();
        for (name, shape) in parameter_shapes(&config) {
            let tensor = tensors
                .get(&name)
                .ok_or_else(|| ModelError::MissingTensor {
                    path: "<in-memory tensors>".into(),
                    tensor: name.clone(),
                    detail: String::new(),
                })?;
            if tensor.dims() != shape.as_slice() {
                return Err(ModelError::ShapeMismatch {
                    path: "<in-memory tensors>".into(),
                    tensor: name,
                    expected: shape,
                    found: tensor.dims().to_vec(),
                });
            }
            parameters.insert(name, Var::from_tensor(tensor)?);
        }
        Ok(Transformer::assemble(config, parameters, &BTreeMap::new()))
    }

    /// The model over `parameters` (every name of `parameter_shapes`, or else in `placeholders`).
    pub(crate) fn assemble(
        config: ModelConfig,
        parameters: BTreeMap<String, Var>,
        placeholders: &BTreeMap<String, Tensor>,
    ) -> Transformer {
        let get = |name: &str| -> Tensor {
            match parameters.get(name) {
                Some(var) => var.as_tensor().clone(),
                None => placeholders[name].clone(),
            }
        };
        let linear = |prefix: &str, has_bias: bool| Linear {
            weight: get(&format!("{prefix}.weight")),
            bias: has_bias.then(|| get(&format!("{prefix}.bias"))),
            packed: None,
            lora: None,
        };
        let mut layers: Vec<DecoderLayer> = (0..config.num_hidden_layers + config.num_mtp_layers)
            .map(|layer| {
                let p = |suffix: &str| format!("model.layers.{layer}.{suffix}");
                let self_attn = match &config.mla {
                    Some(mla) => Attention::Latent(Box::new(LatentAttention {
                        query: match mla.q_lora_rank {
                            Some(_) => LatentQuery::LowRank {
                                q_a_proj: linear(&p("self_attn.q_a_proj"), config.attention_bias),
                                q_a_layernorm: get(&p("self_attn.q_a_layernorm.weight")),
                                q_b_proj: linear(&p("self_attn.q_b_proj"), false),
                            },
                            None => LatentQuery::Direct(linear(&p("self_attn.q_proj"), false)),
                        },
                        kv_a_proj_with_mqa: linear(
                            &p("self_attn.kv_a_proj_with_mqa"),
                            config.attention_bias,
                        ),
                        kv_a_layernorm: get(&p("self_attn.kv_a_layernorm.weight")),
                        kv_b_proj: linear(&p("self_attn.kv_b_proj"), false),
                        o_proj: linear(&p("self_attn.o_proj"), config.attention_output_bias),
                    })),
                    None => Attention::Standard(Box::new(SelfAttention {
                        q_proj: linear(&p("self_attn.q_proj"), config.attention_bias),
                        k_proj: linear(&p("self_attn.k_proj"), config.attention_bias),
                        v_proj: linear(&p("self_attn.v_proj"), config.attention_bias),
                        o_proj: linear(&p("self_attn.o_proj"), config.attention_output_bias),
                        q_norm: (config.qk_norm || config.qk_norm_whole)
                            .then(|| get(&p("self_attn.q_norm.weight"))),
                        k_norm: (config.qk_norm || config.qk_norm_whole)
                            .then(|| get(&p("self_attn.k_norm.weight"))),
                        gate_proj: config
                            .attn_output_gate
                            .then(|| linear(&p("self_attn.gate_proj"), false)),
                    })),
                };
                DecoderLayer {
                    input_layernorm: get(&p("input_layernorm.weight")),
                    self_attn,
                    post_attention_layernorm: get(&p("post_attention_layernorm.weight")),
                    pre_feedforward_layernorm: config
                        .sandwich_norm
                        .then(|| get(&p(&format!("{}.weight", sandwich_names(&config).0)))),
                    post_feedforward_layernorm: config
                        .sandwich_norm
                        .then(|| get(&p(&format!("{}.weight", sandwich_names(&config).1)))),
                    mlp: match (&config.moe, config.is_sparse_layer(layer)) {
                        (Some(moe), true) => {
                            let names = ExpertNames::of(moe.naming);
                            let expert = |[gate, up, down]: [String; 3]| Expert {
                                gate: linear(&p(&gate), false),
                                up: linear(&p(&up), false),
                                down: linear(&p(&down), false),
                            };
                            let shared = moe.shared_expert_intermediate_size.map(|_| {
                                let (base, gate) = names.shared();
                                (
                                    expert([
                                        format!("{base}.gate_proj"),
                                        format!("{base}.up_proj"),
                                        format!("{base}.down_proj"),
                                    ]),
                                    gate.map(|g| get(&p(g))),
                                )
                            });
                            Mlp::Moe(Box::new(MoeBlock {
                                router: get(&p(&names.router())),
                                router_score: moe.router_score,
                                checkpoint_bias: names.checkpoint_bias().map(|b| get(&p(b))),
                                experts: (0..moe.num_experts)
                                    .map(|e| expert(names.expert(e)))
                                    .collect(),
                                shared,
                                top_k: moe.num_experts_per_tok,
                                renormalize: moe.norm_topk_prob,
                                naming: moe.naming,
                                group_limit: moe.group_limit,
                                selection_bias: None,
                                capacity_factor: None,
                            }))
                        }
                        _ => Mlp::SwiGlu {
                            gate_proj: linear(&p("mlp.gate_proj"), config.mlp_bias),
                            up_proj: linear(&p("mlp.up_proj"), config.mlp_bias),
                            down_proj: linear(&p("mlp.down_proj"), config.mlp_bias),
                        },
                    },
                }
            })
            .collect();
        let mtp = layers
            .split_off(config.num_hidden_layers)
            .into_iter()
            .enumerate()
            .map(|(depth, block)| {
                let p = |suffix: &str| {
                    format!("model.layers.{}.{suffix}", config.num_hidden_layers + depth)
                };
                MtpModule {
                    enorm: get(&p("enorm.weight")),
                    hnorm: get(&p("hnorm.weight")),
                    eh_proj: linear(&p("eh_proj"), false),
                    block,
                    post_norm: get(&p("shared_head.norm.weight")),
                }
            })
            .collect();
        let rotary = RotaryTable::new(&config);
        let local_rotary = config
            .local_rope
            .is_some()
            .then(|| RotaryTable::local(&config));
        Transformer {
            local_rotary,
            embed_tokens: get(EMBED_TOKENS),
            norm: get(FINAL_NORM),
            lm_head: (config.score_labels.is_none() && !config.tie_word_embeddings)
                .then(|| get(LM_HEAD)),
            score: config.score_labels.map(|_| get(SCORE_HEAD)),
            score_bias: (config.score_labels.is_some()
                && config.score_kind == (ScoreKind::Token { bias: true }))
            .then(|| get(SCORE_BIAS)),
            packed_head: None,
            layers,
            mtp,
            rotary,
            parameters,
            lora: None,
            config,
            precision: Precision::F32,
            activation_checkpointing: false,
            fused_blocks: true,
            inference_only: false,
        }
    }

    /// Whether this is an `inference_copy` (bf16 generation only).
    pub fn is_inference_only(&self) -> bool {
        self.inference_only
    }

    /// The error for an operation an inference copy cannot do.
    pub(crate) fn refuse_inference_only(&self, what: &str) -> Result<(), ModelError> {
        if self.inference_only {
            return Err(ModelError::InvalidArgument(format!(
                "{what}: this is an inference-only bf16 copy (Transformer::inference_copy) without \
                 f32 linear weights; use the model it was made from"
            )));
        }
        Ok(())
    }

    /// The precision of the linear layers and the LM head (see `stoke_types::Precision`).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Sets the matmul precision; parameters stay as they are (f32 master weights).
    pub fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }

    /// The model with every weight detached: its forward passes build no autograd graph (a
    /// teacher or a reference model that is only read).
    pub fn into_frozen(mut self) -> Transformer {
        self.freeze_base();
        self
    }

    /// Detaches every base tensor the forward pass reads, so no gradient is computed or kept
    /// for them (LoRA). The variables in `parameters` keep the same storage.
    pub(crate) fn freeze_base(&mut self) {
        self.embed_tokens = self.embed_tokens.detach();
        self.norm = self.norm.detach();
        self.lm_head = self.lm_head.as_ref().map(Tensor::detach);
        self.score = self.score.as_ref().map(Tensor::detach);
        self.score_bias = self.score_bias.as_ref().map(Tensor::detach);
        for layer in &mut self.layers {
            layer.freeze();
        }
        for module in &mut self.mtp {
            module.block.freeze();
            for t in [&mut module.enorm, &mut module.hnorm, &mut module.post_norm] {
                *t = t.detach();
            }
            module.eh_proj.weight = module.eh_proj.weight.detach();
        }
    }

    /// Every linear layer of every block, the MTP modules' included (the LM head aside).
    pub(crate) fn linears_mut(&mut self) -> impl Iterator<Item = &mut Linear> {
        self.layers
            .iter_mut()
            .flat_map(DecoderLayer::linears_mut)
            .chain(
                self.mtp
                    .iter_mut()
                    .flat_map(|m| std::iter::once(&mut m.eh_proj).chain(m.block.linears_mut())),
            )
    }

    /// Whether blocks recompute their activations in the backward pass.
    pub fn activation_checkpointing(&self) -> bool {
        self.activation_checkpointing
    }

    /// Activation checkpointing per transformer block (see `activation_checkpoint`): a forward
    /// pass without a KV cache keeps only each block's input, and the backward pass recomputes
    /// the block (about a third more arithmetic for the blocks). Gradients are bit-identical.
    /// CPU only; elsewhere the flag has no effect. `snapshot` and `to_dtype` copies start
    /// without it (they are for inference).
    pub fn set_activation_checkpointing(&mut self, on: bool) {
        self.activation_checkpointing = on;
    }

    /// Whether layers without a KV cache run as one fused node with a hand-written backward
    /// (`fused_block`, the default) or as the composition of ops (the reference form, and what
    /// `STOKE_BLOCK=graph` selects for every model). Values agree up to summation order.
    pub fn set_fused_blocks(&mut self, on: bool) {
        self.fused_blocks = on;
    }

    pub fn fused_blocks(&self) -> bool {
        self.fused_blocks
    }

    /// This model with the given precision (builder form of `set_precision`).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn rotary(&self) -> &RotaryTable {
        &self.rotary
    }

    /// All trainable parameters, HF names, sorted by name.
    pub fn parameters(&self) -> Vec<(String, Var)> {
        self.parameters
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect()
    }

    pub fn device(&self) -> &Device {
        self.embed_tokens.device()
    }

    pub fn dtype(&self) -> DType {
        self.embed_tokens.dtype()
    }

    /// A copy with all parameters converted to `dtype` (new, independent `Var`s).
    pub fn to_dtype(&self, dtype: DType) -> Result<Transformer, ModelError> {
        self.refuse_inference_only("to_dtype")?;
        let tensors = self
            .parameters
            .iter()
            .map(|(n, v)| Ok((n.clone(), v.as_tensor().to_dtype(dtype)?)))
            .collect::<Result<BTreeMap<_, _>, ModelError>>()?;
        Ok(Transformer::from_tensors(self.config.clone(), tensors)?.with_precision(self.precision))
    }

    /// A deep copy: new `Var`s over newly allocated storage, so in-place updates of this model's
    /// parameters (the optimizer's `Var::set`) never show in the copy, nor the other way round.
    /// (`to_dtype` with the same dtype is NOT a copy: candle returns the same variable, and
    /// `Var::from_tensor` keeps a variable's storage.) `detach` drops the variable flag without
    /// copying; `from_tensors` then turns each detached tensor into a fresh `Var`, which copies
    /// its storage once (candle's `make_var`); `Tensor::copy` first would copy twice.
    pub fn snapshot(&self) -> Result<Transformer, ModelError> {
        self.refuse_inference_only("snapshot")?;
        if let Some((config, adapters)) = &self.lora {
            // The frozen base never changes: the copy shares it and copies the adapters.
            let mut copy = self.without_adapters();
            copy.attach(config, |name, _| {
                Ok(adapters[name].as_tensor().flatten_all()?.to_vec1()?)
            })?;
            copy.precision = self.precision;
            copy.activation_checkpointing = false;
            copy.unpack_weights();
            return Ok(copy);
        }
        let tensors = self
            .parameters
            .iter()
            .map(|(name, var)| (name.clone(), var.as_tensor().detach()))
            .collect::<BTreeMap<_, _>>();
        Ok(Transformer::from_tensors(self.config.clone(), tensors)?.with_precision(self.precision))
    }

    /// A smaller model made of some of this one's decoder layers (depth pruning, as DistilBERT's
    /// and Minitron's students start): `layers` are this model's layer indices, strictly
    /// increasing, and become layers `0..layers.len()` of the copy; the embedding, the final norm
    /// and the LM head are copied whole. Per-layer settings (`layer_types`, the RoPE layers) follow
    /// their layers. The copy owns new storage, like [`Transformer::snapshot`].
    ///
    /// Refused, naming the reason: an empty or unordered list, an index past the last layer, a
    /// model with LoRA adapters (merge them first), a mixture of experts or multi-token
    /// prediction layers (their per-layer layouts are not carried over).
    pub fn keep_layers(&self, layers: &[usize]) -> Result<Transformer, ModelError> {
        self.refuse_inference_only("keep_layers")?;
        let config = &self.config;
        let invalid = |message: String| Err(ModelError::InvalidArgument(message));
        if layers.is_empty() {
            return invalid("keep_layers: no layer to keep".into());
        }
        if let Some(&past) = layers.iter().find(|&&l| l >= config.num_hidden_layers) {
            return invalid(format!(
                "keep_layers: layer {past} does not exist (the model has {})",
                config.num_hidden_layers
            ));
        }
        if layers.windows(2).any(|w| w[0] >= w[1]) {
            return invalid(format!(
                "keep_layers: the layers must be strictly increasing, got {layers:?}"
            ));
        }
        if self.lora.is_some() {
            return invalid("keep_layers: the model has LoRA adapters; merge them first".into());
        }
        if config.moe.is_some() || config.num_mtp_layers > 0 {
            return invalid(
                "keep_layers: mixture-of-experts and multi-token-prediction models are not \
                 supported"
                    .into(),
            );
        }
        let mut kept = config.clone();
        kept.num_hidden_layers = layers.len();
        if !config.layer_types.is_empty() {
            kept.layer_types = layers.iter().map(|&l| config.layer_types[l]).collect();
        }
        if !config.rope_layers.is_empty() {
            kept.rope_layers = layers.iter().map(|&l| config.rope_layers[l]).collect();
        }
        let mut tensors = BTreeMap::new();
        for (name, var) in &self.parameters {
            let renamed = match name
                .strip_prefix("model.layers.")
                .and_then(|rest| rest.split_once('.'))
            {
                Some((index, tail)) => {
                    let index: usize = index.parse().map_err(|_| {
                        ModelError::InvalidArgument(format!("keep_layers: parameter {name}"))
                    })?;
                    match layers.iter().position(|&l| l == index) {
                        Some(new_index) => format!("model.layers.{new_index}.{tail}"),
                        None => continue,
                    }
                }
                None => name.clone(),
            };
            tensors.insert(renamed, var.as_tensor().detach());
        }
        Ok(Transformer::from_tensors(kept, tensors)?.with_precision(self.precision))
    }

    /// Sets the balancing bias of MoE layer `layer` (added to its router probabilities for the
    /// top-k choice only; see `moe::BiasRule`). An error for a dense layer or a wrong length.
    pub fn set_expert_bias(&mut self, layer: usize, bias: &[f32]) -> Result<(), ModelError> {
        // AFMoE and DeepSeek-V3 keep their selection bias in the checkpoint: the rule moves
        // that tensor.
        let stored = self.stored_expert_bias_name(layer);
        if let Some(var) = stored.as_ref().and_then(|s| self.parameters.get(s)) {
            let stored = stored.as_deref().unwrap_or_default();
            if var.dims() != [bias.len()] {
                return Err(ModelError::InvalidArgument(format!(
                    "set_expert_bias: {} values for the {:?} of {stored}",
                    bias.len(),
                    var.dims()
                )));
            }
            let values =
                Tensor::from_slice(bias, bias.len(), var.device())?.to_dtype(var.dtype())?;
            var.set(&values)?;
            return Ok(());
        }
        match self.layers.get_mut(layer).map(|l| &mut l.mlp) {
            Some(Mlp::Moe(block)) if block.experts.len() == bias.len() => {
                block.selection_bias = Some(Arc::from(bias));
                Ok(())
            }
            Some(Mlp::Moe(block)) => Err(ModelError::InvalidArgument(format!(
                "set_expert_bias: {} values for the {} experts of layer {layer}",
                bias.len(),
                block.experts.len()
            ))),
            _ => Err(ModelError::InvalidArgument(format!(
                "set_expert_bias: layer {layer} is not a mixture of experts"
            ))),
        }
    }

    /// The checkpoint name of layer `layer`'s selection bias, for families that store one.
    pub(super) fn stored_expert_bias_name(&self, layer: usize) -> Option<String> {
        let moe = self.config.moe.as_ref()?;
        let bias = ExpertNames::of(moe.naming).checkpoint_bias()?;
        Some(format!("model.layers.{layer}.{bias}"))
    }

    /// Sets an expert capacity factor on every MoE layer (the MTP modules' included): in each
    /// forward pass an expert takes at most `ceil(factor * tokens * top_k / experts)` (token,
    /// slot) pairs, first choices before second ones and then in token order; the others are
    /// dropped (the token skips that expert; shared experts and the residual still carry it) and
    /// counted in `Routing::dropped`. `None` (the default) drops nothing.
    pub fn set_expert_capacity(&mut self, factor: Option<f64>) -> Result<(), ModelError> {
        if let Some(f) = factor
            && !(f.is_finite() && f > 0.0)
        {
            return Err(ModelError::InvalidArgument(format!(
                "set_expert_capacity: the factor must be positive, got {f}"
            )));
        }
        for layer in self
            .layers
            .iter_mut()
            .chain(self.mtp.iter_mut().map(|m| &mut m.block))
        {
            if let Mlp::Moe(block) = &mut layer.mlp {
                block.capacity_factor = factor;
            }
        }
        Ok(())
    }

    /// The balancing bias of MoE layer `layer`, when one is set.
    pub fn expert_bias(&self, layer: usize) -> Option<Vec<f32>> {
        let stored = self.stored_expert_bias_name(layer);
        if let Some(var) = stored.as_ref().and_then(|s| self.parameters.get(s)) {
            return var
                .as_tensor()
                .to_dtype(DType::F32)
                .and_then(|t| t.to_vec1())
                .ok();
        }
        match self.layers.get(layer).map(|l| &l.mlp) {
            Some(Mlp::Moe(block)) => block.selection_bias.as_ref().map(|b| b.to_vec()),
            _ => None,
        }
    }

    /// The LM head's weight [vocab, hidden] (`lm_head.weight`, or the embedding when tied), for
    /// fused heads such as `stoke_ops::linear_target_logprobs`. Those compute `hidden · W^T`
    /// only: with a final-logit soft-cap (`config().final_logit_softcap`) the logits are
    /// `lm_logits`' instead.
    pub fn lm_head_weight(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tiny_model() -> Transformer {
        let json = r#"{
            "architectures": ["LlamaForCausalLM"], "vocab_size": 37, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "rope_theta": 1000.0,
            "tie_word_embeddings": false
        }"#;
        let config = ModelConfig::from_json_str(json, Path::new("<test>")).expect("config");
        Transformer::init(config, &Device::Cpu, 3).expect("init")
    }

    fn values(var: &Var) -> Vec<f32> {
        var.as_tensor()
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("values")
    }

    #[test]
    fn snapshot_does_not_see_in_place_updates_of_the_original() {
        let original = tiny_model();
        let copy = original.snapshot().expect("snapshot");
        let before: Vec<Vec<f32>> = copy.parameters().iter().map(|(_, v)| values(v)).collect();
        for (_, var) in original.parameters() {
            // In place, as the optimizer does: the original's storage is overwritten.
            let shifted = (var.as_tensor() + 1.0).expect("add");
            var.set(&shifted).expect("set");
        }
        let after: Vec<Vec<f32>> = copy.parameters().iter().map(|(_, v)| values(v)).collect();
        assert_eq!(before, after, "the snapshot changed with the original");
        let changed: Vec<Vec<f32>> = original
            .parameters()
            .iter()
            .map(|(_, v)| values(v))
            .collect();
        assert_ne!(changed, after, "the update did not reach the original");
        // The other direction: updating the copy leaves the original alone.
        let (_, first) = &copy.parameters()[0];
        first
            .set(&first.as_tensor().zeros_like().expect("zeros"))
            .expect("set");
        assert_eq!(values(&original.parameters()[0].1), changed[0]);
    }
}
