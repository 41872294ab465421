//! The decoder-only transformer (Llama / Qwen2 / Qwen3 / Gemma 2-3 / SmolLM3) with trainable
//! parameters. The families differ by config only (`ModelConfig`: activation, sandwich and (1 + w)
//! norms, embedding scale, attention scale and soft-caps, sliding-window and NoPE layers).
//!
//! What it is: embeddings -> N x [RMSNorm -> attention (GQA, RoPE, optional q/k/v/o biases,
//! optional per-head q/k RMSNorm) -> residual -> RMSNorm -> MLP (SwiGLU) -> residual] ->
//! RMSNorm -> LM head (tied to the embeddings or separate). Every parameter is a candle `Var`
//! named as in Hugging Face checkpoints; `parameters()` lists them sorted by name.
//! All computation goes through stoke-ops' differentiable compositions, so `loss.backward()`
//! reaches every parameter.
//!
//! What it is not: stateful. The KV cache is passed to `forward`; positions and the attention
//! bias come from the caller (so left padding, right padding and packed documents are all
//! expressed by the caller, see mask.rs). No dropout (HF's attention_dropout is 0 for these
//! models). Variants (MoE MLPs, other norms) extend `Mlp` / `Architecture` locally.
//!
//! Invariants: `parameter_shapes(config)` is the single list of tensor names and shapes used
//! by `init`, `load`, `save` and `num_parameters`; the parameter dtype is uniform (f32
//! normally; `to_dtype(F64)` exists for finite-difference checks).

use crate::activation_checkpoint::checkpointed;
use crate::config::{Activation, ExpertNaming, ModelConfig, RouterScore};
use crate::error::ModelError;
use crate::kv_cache::KvCache;
use crate::lora::LoraAdapter;
use crate::moe::Routing;
use crate::rotary::RotaryTable;
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use stoke_ops::bf16::PackedA;
use stoke_ops::pages::PageRegion;
use stoke_ops::{Precision, apply_rope, attention, attention_with, rms_norm, swiglu};

/// Standard deviation of the random initialisation of weight matrices (HF `initializer_range`).
const INIT_STD: f64 = 0.02;

pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

/// The MLP's sandwich norms, `(pre, post)`: Gemma's `pre_feedforward_layernorm` /
/// `post_feedforward_layernorm`, AFMoE's `pre_mlp_layernorm` / `post_mlp_layernorm`.
pub(crate) fn sandwich_names(config: &ModelConfig) -> (&'static str, &'static str) {
    match config.architecture {
        crate::config::Architecture::Afmoe => ("pre_mlp_layernorm", "post_mlp_layernorm"),
        _ => ("pre_feedforward_layernorm", "post_feedforward_layernorm"),
    }
}

/// Every parameter tensor of the model described by `config`: HF name and shape. When the
/// embeddings are tied, `lm_head.weight` is absent (it is `model.embed_tokens.weight`).
pub fn parameter_shapes(config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, d, i) = (
        config.hidden_size,
        config.head_dim,
        config.intermediate_size,
    );
    let q_out = config.num_attention_heads * d;
    let kv_out = config.num_key_value_heads * d;
    let mut shapes = vec![
        (EMBED_TOKENS.to_string(), vec![config.vocab_size, h]),
        (FINAL_NORM.to_string(), vec![h]),
    ];
    if !config.tie_word_embeddings {
        shapes.push((LM_HEAD.to_string(), vec![config.vocab_size, h]));
    }
    for layer in 0..config.num_hidden_layers + config.num_mtp_layers {
        let p = |suffix: &str| format!("model.layers.{layer}.{suffix}");
        if layer >= config.num_hidden_layers {
            // A multi-token prediction module around its block (transformers' MtpLayer under
            // DeepSeek-V3's checkpoint names; the embedding and head are the model's).
            shapes.push((p("enorm.weight"), vec![h]));
            shapes.push((p("hnorm.weight"), vec![h]));
            shapes.push((p("eh_proj.weight"), vec![h, 2 * h]));
            shapes.push((p("shared_head.norm.weight"), vec![h]));
        }
        shapes.push((p("input_layernorm.weight"), vec![h]));
        shapes.push((p("post_attention_layernorm.weight"), vec![h]));
        if config.sandwich_norm {
            let (pre, post) = sandwich_names(config);
            shapes.push((p(&format!("{pre}.weight")), vec![h]));
            shapes.push((p(&format!("{post}.weight")), vec![h]));
        }
        if config.attn_output_gate {
            shapes.push((p("self_attn.gate_proj.weight"), vec![q_out, h]));
        }
        if let Some(mla) = &config.mla {
            latent_attention_shapes(&mut shapes, &p, config, mla);
        } else {
            for (proj, out) in [("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)] {
                shapes.push((p(&format!("self_attn.{proj}.weight")), vec![out, h]));
                if config.attention_bias {
                    shapes.push((p(&format!("self_attn.{proj}.bias")), vec![out]));
                }
            }
            shapes.push((p("self_attn.o_proj.weight"), vec![h, q_out]));
            if config.attention_output_bias {
                shapes.push((p("self_attn.o_proj.bias"), vec![h]));
            }
        }
        if config.qk_norm {
            shapes.push((p("self_attn.q_norm.weight"), vec![d]));
            shapes.push((p("self_attn.k_norm.weight"), vec![d]));
        }
        if config.qk_norm_whole {
            shapes.push((p("self_attn.q_norm.weight"), vec![q_out]));
            shapes.push((p("self_attn.k_norm.weight"), vec![kv_out]));
        }
        if let (Some(moe), true) = (&config.moe, config.is_sparse_layer(layer)) {
            let (e, ei) = (moe.num_experts, moe.expert_intermediate_size);
            let names = ExpertNames::of(moe.naming);
            shapes.push((p(&names.router()), vec![e, h]));
            if let Some(bias) = names.checkpoint_bias() {
                shapes.push((p(bias), vec![e]));
            }
            for expert in 0..e {
                let [gate, up, down] = names.expert(expert);
                shapes.push((p(&format!("{gate}.weight")), vec![ei, h]));
                shapes.push((p(&format!("{up}.weight")), vec![ei, h]));
                shapes.push((p(&format!("{down}.weight")), vec![h, ei]));
            }
            if let Some(si) = moe.shared_expert_intermediate_size {
                let (base, gate) = names.shared();
                for (proj, shape) in [
                    ("gate_proj", vec![si, h]),
                    ("up_proj", vec![si, h]),
                    ("down_proj", vec![h, si]),
                ] {
                    shapes.push((p(&format!("{base}.{proj}.weight")), shape));
                }
                if let Some(gate) = gate {
                    shapes.push((p(gate), vec![1, h]));
                }
            }
            continue;
        }
        for (proj, shape) in [
            ("gate_proj", vec![i, h]),
            ("up_proj", vec![i, h]),
            ("down_proj", vec![h, i]),
        ] {
            let out = shape[0];
            shapes.push((p(&format!("mlp.{proj}.weight")), shape));
            if config.mlp_bias {
                shapes.push((p(&format!("mlp.{proj}.bias")), vec![out]));
            }
        }
    }
    shapes.sort();
    shapes
}

/// Multi-head latent attention's tensors (DeepseekV3Attention's names); the q/kv "a"
/// projections and o_proj carry biases with `attention_bias`.
fn latent_attention_shapes(
    shapes: &mut Vec<(String, Vec<usize>)>,
    p: &dyn Fn(&str) -> String,
    config: &ModelConfig,
    mla: &crate::config::MlaConfig,
) {
    let (h, heads) = (config.hidden_size, config.num_attention_heads);
    let q_out = heads * mla.qk_head_dim();
    let bias = config.attention_bias;
    let mut linear = |name: &str, out: usize, input: usize, has_bias: bool| {
        shapes.push((p(&format!("self_attn.{name}.weight")), vec![out, input]));
        if has_bias {
            shapes.push((p(&format!("self_attn.{name}.bias")), vec![out]));
        }
    };
    match mla.q_lora_rank {
        Some(rank) => {
            linear("q_a_proj", rank, h, bias);
            linear("q_b_proj", q_out, rank, false);
        }
        None => linear("q_proj", q_out, h, false),
    }
    let latent = mla.kv_lora_rank;
    linear("kv_a_proj_with_mqa", latent + mla.qk_rope_head_dim, h, bias);
    linear(
        "kv_b_proj",
        heads * (mla.qk_nope_head_dim + mla.v_head_dim),
        latent,
        false,
    );
    linear(
        "o_proj",
        h,
        heads * mla.v_head_dim,
        config.attention_output_bias,
    );
    if let Some(rank) = mla.q_lora_rank {
        shapes.push((p("self_attn.q_a_layernorm.weight"), vec![rank]));
    }
    shapes.push((p("self_attn.kv_a_layernorm.weight"), vec![latent]));
}

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
    fn forward(&self, x: &Tensor, precision: Precision) -> candle_core::Result<Tensor> {
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
    fn effective_weight(&self) -> candle_core::Result<Tensor> {
        match &self.lora {
            Some(lora) => self.weight.clone() + lora.b.matmul(&lora.a)?.affine(lora.scale, 0.0)?,
            None => Ok(self.weight.clone()),
        }
    }

    /// The variables this layer reads (a frozen weight is none).
    fn tracked(&self) -> impl Iterator<Item = &Tensor> {
        let lora = self.lora.iter().flat_map(|l| [&l.a, &l.b]);
        std::iter::once(&self.weight)
            .chain(self.bias.iter())
            .chain(lora)
            .filter(|t| t.is_variable())
    }
}

/// The feed-forward block: one gated MLP, or a mixture of experts.
#[derive(Debug, Clone)]
pub(crate) enum Mlp {
    SwiGlu {
        gate_proj: Linear,
        up_proj: Linear,
        down_proj: Linear,
    },
    Moe(Box<MoeBlock>),
}

/// Module names of a sparse MLP within a layer (checkpoint naming of the family).
pub(crate) struct ExpertNames {
    /// `block_sparse_moe` (Mixtral) or `mlp`.
    pub(crate) block: &'static str,
    naming: ExpertNaming,
}

impl ExpertNames {
    pub(crate) fn of(naming: ExpertNaming) -> ExpertNames {
        ExpertNames {
            block: match naming {
                ExpertNaming::Mixtral => "block_sparse_moe",
                ExpertNaming::Qwen | ExpertNaming::Afmoe | ExpertNaming::Deepseek => "mlp",
            },
            naming,
        }
    }

    /// The router's weight `[experts, hidden]`.
    pub(crate) fn router(&self) -> String {
        match self.naming {
            ExpertNaming::Afmoe => "mlp.router.gate.weight".into(),
            _ => format!("{}.gate.weight", self.block),
        }
    }

    /// The shared expert's module (Qwen2-MoE `mlp.shared_expert`, AFMoE `mlp.shared_experts`)
    /// and its gate's weight, when it has one (Qwen2-MoE).
    pub(crate) fn shared(&self) -> (&'static str, Option<&'static str>) {
        match self.naming {
            ExpertNaming::Afmoe | ExpertNaming::Deepseek => ("mlp.shared_experts", None),
            _ => ("mlp.shared_expert", Some("mlp.shared_expert_gate.weight")),
        }
    }

    /// The selection bias stored in the checkpoint (AFMoE's `mlp.expert_bias`, DeepSeek-V3's
    /// `mlp.gate.e_score_correction_bias`).
    pub(crate) fn checkpoint_bias(&self) -> Option<&'static str> {
        match self.naming {
            ExpertNaming::Afmoe => Some("mlp.expert_bias"),
            ExpertNaming::Deepseek => Some("mlp.gate.e_score_correction_bias"),
            _ => None,
        }
    }

    /// Expert `e`'s gate, up and down modules.
    pub(crate) fn expert(&self, e: usize) -> [String; 3] {
        let base = format!("{}.experts.{e}", self.block);
        match self.naming {
            ExpertNaming::Mixtral => [
                format!("{base}.w1"),
                format!("{base}.w3"),
                format!("{base}.w2"),
            ],
            ExpertNaming::Qwen | ExpertNaming::Afmoe | ExpertNaming::Deepseek => [
                format!("{base}.gate_proj"),
                format!("{base}.up_proj"),
                format!("{base}.down_proj"),
            ],
        }
    }
}

/// One gated MLP (an expert, or Qwen2-MoE's shared expert).
#[derive(Debug, Clone)]
pub(crate) struct Expert {
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

impl Expert {
    fn forward(&self, x: &Tensor, p: Precision, act: Activation) -> candle_core::Result<Tensor> {
        let gate = self.gate.forward(x, p)?;
        let up = self.up.forward(x, p)?;
        self.down.forward(&gated(&gate, &up, act)?, p)
    }
}

/// A sparse mixture-of-experts MLP (see `MoeConfig`).
///
/// Routing: `softmax(x R^T)` over the experts in f32, the top-k per token (ties to the lower
/// index), their probabilities renormalized when the family does. Expert computation is grouped:
/// the (token, slot) pairs are sorted by expert with a counting sort, each expert runs one matmul
/// chain over its contiguous rows, and an index_select puts the rows back to (token, slot)
/// order, where the routing weights scale them and the k slots are summed. Every step is a
/// differentiable candle op, so gradients reach the router (through the weights) and the experts.
#[derive(Debug, Clone)]
pub(crate) struct MoeBlock {
    pub(crate) router: Tensor,
    pub(crate) router_score: RouterScore,
    /// AFMoE's selection bias from the checkpoint (`mlp.expert_bias`, `[experts]`).
    pub(crate) checkpoint_bias: Option<Tensor>,
    pub(crate) experts: Vec<Expert>,
    /// The shared expert and, for Qwen2-MoE, its sigmoid gate's weight `[1, hidden]`.
    pub(crate) shared: Option<(Expert, Option<Tensor>)>,
    pub(crate) top_k: usize,
    pub(crate) renormalize: bool,
    pub(crate) naming: ExpertNaming,
    /// DeepSeek-V3's group-limited choice.
    pub(crate) group_limit: Option<crate::config::GroupLimit>,
    /// The balancing bias added to the router probabilities for the top-k choice only
    /// (`Transformer::set_expert_bias`); training state, not a checkpoint tensor.
    pub(crate) selection_bias: Option<Arc<[f32]>>,
    /// Expert capacity factor (`Transformer::set_expert_capacity`): each expert takes at most
    /// `ceil(factor * tokens * top_k / experts)` of a forward pass's (token, slot) pairs.
    pub(crate) capacity_factor: Option<f64>,
}

impl MoeBlock {
    /// The block's output for `x` [N, hidden] and what it routed (layer `layer`).
    fn forward(
        &self,
        x: &Tensor,
        p: Precision,
        act: Activation,
        layer: usize,
    ) -> candle_core::Result<(Tensor, Routing)> {
        let (n, hidden) = x.dims2()?;
        let experts = self.experts.len();
        let k = self.top_k;
        let logits = x.matmul(&self.router.t()?)?;
        let probs = match self.router_score {
            RouterScore::Softmax => {
                stoke_ops::softmax(&logits.to_dtype(DType::F32)?, candle_core::D::Minus1)?
            }
            RouterScore::Sigmoid { .. } => {
                stoke_ops::logistic::sigmoid(&logits.to_dtype(DType::F32)?)?
            }
        };
        let values: Vec<f32> = probs.flatten_all()?.to_vec1()?;
        let stored_bias: Option<Vec<f32>> = match &self.checkpoint_bias {
            Some(b) => Some(b.to_dtype(DType::F32)?.to_vec1()?),
            None => None,
        };
        let mut chosen = Vec::with_capacity(n * k);
        let mut order: Vec<usize> = Vec::with_capacity(experts);
        // A balancing bias shifts the choice only (the weights below are the unbiased
        // probabilities).
        let mut scores = vec![0f32; experts];
        for row in values.chunks_exact(experts) {
            scores.copy_from_slice(row);
            for bias in [stored_bias.as_deref(), self.selection_bias.as_deref()]
                .into_iter()
                .flatten()
            {
                for (s, &b) in scores.iter_mut().zip(bias) {
                    *s += b;
                }
            }
            if let Some(limit) = self.group_limit {
                mask_weak_groups(&mut scores, limit);
            }
            order.clear();
            order.extend(0..experts);
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            chosen.extend(order[..k].iter().map(|&e| e as u32));
        }
        let index = Tensor::from_vec(chosen.clone(), (n, k), x.device())?;
        let mut weights = probs.gather(&index, 1)?;
        match self.router_score {
            RouterScore::Softmax if self.renormalize => {
                weights = weights.broadcast_div(&weights.sum_keepdim(1)?)?;
            }
            RouterScore::Softmax => {}
            // AfmoeTokenChoiceRouter, DeepseekV3TopkRouter: the chosen sigmoid scores over their
            // sum (+1e-20) with norm_topk_prob, times route_scale (routed_scaling_factor).
            RouterScore::Sigmoid { route_scale } => {
                if self.renormalize {
                    weights = weights.broadcast_div(&(weights.sum_keepdim(1)? + 1e-20)?)?;
                }
                weights = weights.affine(route_scale, 0.0)?;
            }
        }
        let weights = weights.to_dtype(x.dtype())?;
        // With a capacity, pairs are admitted by slot (every token's first choice before any
        // second choice, GShard's priority), then in token order, until the expert is full.
        let mut kept = vec![true; n * k];
        let mut dropped = 0u64;
        if let Some(factor) = self.capacity_factor {
            let capacity = (factor * (n * k) as f64 / experts as f64).ceil() as usize;
            let mut taken = vec![0usize; experts];
            for slot in 0..k {
                for token in 0..n {
                    let pair = token * k + slot;
                    let e = chosen[pair] as usize;
                    if taken[e] < capacity {
                        taken[e] += 1;
                    } else {
                        kept[pair] = false;
                        dropped += 1;
                    }
                }
            }
        }
        // Counting sort of the kept (token, slot) pairs by expert; a dropped pair reads the zero
        // row appended after them.
        let mut counts = vec![0usize; experts];
        for (&e, _) in chosen.iter().zip(&kept).filter(|(_, k)| **k) {
            counts[e as usize] += 1;
        }
        let mut starts = vec![0usize; experts];
        for e in 1..experts {
            starts[e] = starts[e - 1] + counts[e - 1];
        }
        let admitted: usize = counts.iter().sum();
        let mut next = starts.clone();
        let mut tokens = vec![0u32; admitted];
        let mut sorted_row = vec![admitted as u32; n * k];
        for (pair, &e) in chosen.iter().enumerate() {
            if !kept[pair] {
                continue;
            }
            let at = next[e as usize];
            tokens[at] = (pair / k) as u32;
            sorted_row[pair] = at as u32;
            next[e as usize] += 1;
        }
        let gathered = x.index_select(&Tensor::from_vec(tokens, admitted, x.device())?, 0)?;
        let mut outputs = Vec::new();
        for (e, expert) in self.experts.iter().enumerate() {
            if counts[e] > 0 {
                outputs.push(expert.forward(&gathered.narrow(0, starts[e], counts[e])?, p, act)?);
            }
        }
        if dropped > 0 {
            outputs.push(Tensor::zeros((1, hidden), x.dtype(), x.device())?);
        }
        let sorted = Tensor::cat(&outputs, 0)?;
        let per_slot = sorted
            .index_select(&Tensor::from_vec(sorted_row, n * k, x.device())?, 0)?
            .reshape((n, k, hidden))?;
        let mut out = per_slot.broadcast_mul(&weights.unsqueeze(2)?)?.sum(1)?;
        if let Some((shared, gate)) = &self.shared {
            let shared_out = shared.forward(x, p, act)?;
            out = match gate {
                Some(gate) => {
                    let g = stoke_ops::logistic::sigmoid(&x.matmul(&gate.t()?)?)?;
                    (out + shared_out.broadcast_mul(&g)?)?
                }
                None => (out + shared_out)?,
            };
        }
        Ok((
            out,
            Routing {
                layer,
                logits,
                chosen,
                top_k: k,
                dropped,
            },
        ))
    }
}

/// DeepSeek-V3's group limit on one token's choice scores: each group of
/// `experts / groups` is scored by the sum of its two best scores, and every expert outside
/// the `topk_groups` best groups gets -inf (ties to the lower group, as the expert order).
pub(crate) fn mask_weak_groups(scores: &mut [f32], limit: crate::config::GroupLimit) {
    let size = scores.len() / limit.groups;
    let group_score = |g: usize| {
        let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &s in &scores[g * size..(g + 1) * size] {
            if s > first {
                second = first;
                first = s;
            } else if s > second {
                second = s;
            }
        }
        if size == 1 { first } else { first + second }
    };
    let group_scores: Vec<f32> = (0..limit.groups).map(group_score).collect();
    let mut order: Vec<usize> = (0..limit.groups).collect();
    order.sort_by(|&a, &b| group_scores[b].total_cmp(&group_scores[a]).then(a.cmp(&b)));
    for &g in &order[limit.topk_groups..] {
        scores[g * size..(g + 1) * size].fill(f32::NEG_INFINITY);
    }
}

/// `act(gate) * up`: SwiGLU through the fused op, the other activations as candle compositions.
fn gated(gate: &Tensor, up: &Tensor, act: Activation) -> candle_core::Result<Tensor> {
    match act {
        Activation::Silu => swiglu(gate, up),
        Activation::GeluTanh => gate.gelu()? * up,
        Activation::Gelu => gate.gelu_erf()? * up,
        Activation::Relu2 => gate.relu()?.sqr()? * up,
    }
}

impl Mlp {
    /// `down(act(gate(x)) * up(x))`; SwiGLU through the fused op, the other activations as
    /// candle compositions (their backward passes are candle's).
    /// The MLP's output and, for a mixture of experts, what it routed.
    fn forward(
        &self,
        x: &Tensor,
        p: Precision,
        act: Activation,
        layer: usize,
    ) -> candle_core::Result<(Tensor, Option<Routing>)> {
        match self {
            Mlp::SwiGlu {
                gate_proj,
                up_proj,
                down_proj,
            } => {
                let gate = gate_proj.forward(x, p)?;
                let up = up_proj.forward(x, p)?;
                Ok((down_proj.forward(&gated(&gate, &up, act)?, p)?, None))
            }
            Mlp::Moe(block) => {
                let (out, routing) = block.forward(x, p, act, layer)?;
                Ok((out, Some(routing)))
            }
        }
    }

    /// The dense MLP's three projections (`None` for a mixture of experts).
    pub(crate) fn dense(&self) -> Option<(&Linear, &Linear, &Linear)> {
        match self {
            Mlp::SwiGlu {
                gate_proj,
                up_proj,
                down_proj,
            } => Some((gate_proj, up_proj, down_proj)),
            Mlp::Moe(_) => None,
        }
    }
}

/// RMSNorm with the model's weight convention: `norm(x) * w`, or Gemma's `norm(x) * (1 + w)`
/// (the offset is added in the graph, so the gradient reaches `w`).
pub(crate) fn model_rms_norm(
    x: &Tensor,
    weight: &Tensor,
    eps: f64,
    unit_offset: bool,
) -> candle_core::Result<Tensor> {
    if unit_offset {
        rms_norm(x, &weight.affine(1.0, 1.0)?, eps)
    } else {
        rms_norm(x, weight, eps)
    }
}

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
    fn norms(&self) -> Vec<&Tensor> {
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

    fn norms_mut(&mut self) -> Vec<&mut Tensor> {
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
    fn named_linears(&self) -> Vec<(String, &Linear)> {
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

    fn named_linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
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

    fn forward(
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

/// Shapes and constants every layer needs during a forward pass (shared by the checkpointed
/// blocks, which recompute in the backward pass).
struct ForwardContext {
    config: Arc<ModelConfig>,
    cos: Tensor,
    sin: Tensor,
    /// cos and sin of the sliding-window layers' own RoPE (Gemma 3), when it differs.
    local_cos_sin: Option<(Tensor, Tensor)>,
    bias: Tensor,
    /// `bias` plus the sliding window's mask, over the same keys (models with sliding layers).
    window_bias: Option<Tensor>,
    /// Where MoE layers record what they routed, when the caller asked (`forward_hidden_routed`).
    routings: Option<std::sync::Mutex<Vec<Routing>>>,
    /// Where attention layers record each query head's largest logit, when asked
    /// (`forward_hidden_recorded`, MuonClip).
    max_logits: Option<std::sync::Mutex<LayerLogits>>,
    precision: Precision,
    /// The shared inputs of the fused block path, when this pass may take it.
    fused: Option<Arc<crate::fused_block::FusedInputs>>,
    /// Subtracted from a layer's index to find its slot in the cache (the MTP modules' blocks,
    /// layers `num_hidden_layers + d`, keep their own cache with slot `d`).
    cache_offset: usize,
}

#[derive(Debug, Clone)]
pub struct Transformer {
    config: ModelConfig,
    /// Every base parameter by HF name (the variables; under LoRA they are frozen: the layers
    /// read detached views, and `trainable_parameters` lists the adapters instead).
    parameters: BTreeMap<String, Var>,
    pub(crate) embed_tokens: Tensor,
    pub(crate) layers: Vec<DecoderLayer>,
    /// Multi-token prediction modules (DeepSeek-V3), depth 1 first.
    pub(crate) mtp: Vec<MtpModule>,
    pub(crate) norm: Tensor,
    pub(crate) lm_head: Option<Tensor>,
    /// LoRA adapters by PEFT name (`base_model.model.<module>.lora_A.weight`), with their config.
    pub(crate) lora: Option<(crate::lora::LoraConfig, BTreeMap<String, Var>)>,
    /// The LM head's weight packed in bf16 for inference (`pack_weights`).
    pub(crate) packed_head: Option<Arc<PackedA>>,
    rotary: RotaryTable,
    /// The sliding-window layers' RoPE table when it differs from `rotary` (Gemma 3).
    local_rotary: Option<RotaryTable>,
    /// How the linear layers and the LM head multiply (`Precision::F32` unless set).
    precision: Precision,
    /// Recompute each block's activations in the backward pass (`set_activation_checkpointing`).
    activation_checkpointing: bool,
    /// Layers run as one fused node where they can (`fused_block`); off: the op composition.
    fused_blocks: bool,
    /// Made by `inference_copy`: linear layers only packed (their f32 weights are placeholders).
    inference_only: bool,
}

/// How `Transformer::init_with` draws the weight matrices of a from-scratch model (biases are 0
/// and norm gains 1 in every scheme, except a sandwich's post norms: sqrt(0.5)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InitScheme {
    /// N(0, std²): transformers' `_init_weights` with `initializer_range` (default 0.02).
    Normal { std: f64 },
    /// N(0, std²) cut at ±3 std (a draw outside is drawn again): OLMo 2's init, std 0.02.
    TruncatedNormal { std: f64 },
    /// Width- and depth-scaled, truncated at ±3 σ: σ = 1/sqrt(hidden_size) for every matrix, and
    /// the two projections that write into the residual stream (`o_proj`, `down_proj`) further
    /// divided by sqrt(2 · num_hidden_layers), so the residual's variance stays the same whatever
    /// the depth (GPT-2 / Megatron's output scaling on a 1/sqrt(d_model) base).
    Scaled,
}

impl Default for InitScheme {
    fn default() -> Self {
        InitScheme::Normal { std: INIT_STD }
    }
}

impl InitScheme {
    /// The standard deviation of parameter `name` and whether draws are cut at ±3 of it.
    fn std_of(self, name: &str, config: &ModelConfig) -> (f64, bool) {
        match self {
            InitScheme::Normal { std } => (std, false),
            InitScheme::TruncatedNormal { std } => (std, true),
            InitScheme::Scaled => {
                let base = 1.0 / (config.hidden_size as f64).sqrt();
                let residual_output = name.ends_with("self_attn.o_proj.weight")
                    || name.ends_with("mlp.down_proj.weight");
                if residual_output {
                    (base / (2.0 * config.num_hidden_layers as f64).sqrt(), true)
                } else {
                    (base, true)
                }
            }
        }
    }
}

impl Transformer {
    /// Random initialisation: weight matrices ~ N(0, 0.02), biases 0, norm weights 1.
    /// Deterministic in `seed` (ChaCha8 stream over the sorted parameter list).
    pub fn init(
        config: ModelConfig,
        device: &Device,
        seed: u64,
    ) -> Result<Transformer, ModelError> {
        Transformer::init_with(config, device, seed, InitScheme::default())
    }

    /// Random initialisation with `scheme` (see [`InitScheme`]); deterministic in `seed`.
    /// `InitScheme::default()` draws exactly what [`Transformer::init`] draws.
    pub fn init_with(
        config: ModelConfig,
        device: &Device,
        seed: u64,
        scheme: InitScheme,
    ) -> Result<Transformer, ModelError> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = BTreeMap::new();
        for (name, shape) in parameter_shapes(&config) {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = if name.ends_with("norm.weight") {
                // Gain 1, except the post norms of a sandwich (the outputs of attention and
                // MLP before the residual add): sqrt(0.5), so that the two branches together
                // add about the variance one pre-norm branch does. A (1 + w) norm stores the
                // gain minus 1 (transformers' Gemma init is w = 0, gain 1).
                let post = config.sandwich_norm
                    && (name.ends_with("post_attention_layernorm.weight")
                        || name.ends_with(&format!("{}.weight", sandwich_names(&config).1)));
                let gain = if post {
                    std::f32::consts::FRAC_1_SQRT_2
                } else {
                    1.0
                };
                vec![
                    if config.norm_unit_offset {
                        gain - 1.0
                    } else {
                        gain
                    };
                    n
                ]
            } else if name.ends_with(".bias") || name.ends_with("expert_bias") {
                vec![0.0; n]
            } else {
                let (std, truncated) = scheme.std_of(&name, &config);
                (0..n)
                    .map(|_| {
                        let mut z = standard_normal(&mut rng);
                        while truncated && z.abs() > 3.0 {
                            z = standard_normal(&mut rng);
                        }
                        (z * std) as f32
                    })
                    .collect()
            };
            tensors.insert(name, Tensor::from_vec(values, shape, device)?);
        }
        Transformer::from_tensors(config, tensors)
    }

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
            lm_head: (!config.tie_word_embeddings).then(|| get(LM_HEAD)),
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

    /// A copy for generation in bf16 (the GRPO rollout's weights): every linear weight and the LM
    /// head only as packed bf16 (`pack_weights`), the embedding, norms and biases as new f32
    /// copies, and no f32 copy of the linear layers. At Llama-3.2-1B's shapes 3.6 GB, where a
    /// `snapshot` plus `pack_weights` holds 7.4 GB.
    ///
    /// Invariant: the copy runs bf16 forward passes (prefill) and fused decode steps only. Its
    /// linear layers read zero-size placeholders where the f32 weights were, so everything else
    /// is refused by name: a forward pass in f32 precision, `snapshot`, `to_dtype`, `save`.
    /// `parameters()` lists the tensors it holds. A model with LoRA adapters (whose base a
    /// snapshot already shares) or off the CPU gets `snapshot` + `pack_weights` instead.
    pub fn inference_copy(&self) -> Result<Transformer, ModelError> {
        if self.lora.is_some()
            || !self.device().is_cpu()
            || self.dtype() != DType::F32
            || !self.config.is_plain()
        {
            let mut copy = self.snapshot()?;
            copy.pack_weights()?;
            return Ok(copy);
        }
        let is_linear = |name: &str| name.ends_with("_proj.weight") || name == LM_HEAD;
        let mut parameters = BTreeMap::new();
        let mut placeholders = BTreeMap::new();
        for (name, shape) in parameter_shapes(&self.config) {
            if is_linear(&name) {
                let zero = Tensor::zeros((), DType::F32, self.device())?;
                placeholders.insert(name, zero.broadcast_as(shape)?);
            } else {
                let var = Var::from_tensor(&self.parameters[&name].as_tensor().detach())?;
                parameters.insert(name, var);
            }
        }
        let mut copy = Transformer::assemble(self.config.clone(), parameters, &placeholders);
        let sources = || self.layers.iter().flat_map(DecoderLayer::linears);
        let region = packing_region(
            sources()
                .map(|source| &source.weight)
                .chain([self.lm_head_weight()]),
        )?;
        for (linear, source) in copy.linears_mut().zip(sources()) {
            linear.packed = Some(pack(&source.weight, region.as_ref())?);
        }
        copy.packed_head = Some(pack(self.lm_head_weight(), region.as_ref())?);
        copy.precision = Precision::Bf16;
        copy.inference_only = true;
        Ok(copy)
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

    /// For inference: switches to `Precision::Bf16` and packs every linear weight and the LM head
    /// into bf16 once (about half the f32 weights' bytes, held next to them), so decoding reads
    /// each weight as bf16 once per step instead of packing it per call. The layout is
    /// `PackedA`'s row-major bf16 pairs: the fused decode step (`decode_step`) streams those rows
    /// directly, and a prefill uses them as the GEMM's left operand (`bf16::matmul_weight_rows`).
    ///
    /// The packed matrices share one region of 2 MiB huge pages (`stoke_ops::pages`): decoding
    /// sweeps them all every step, and on 4 KiB pages that sweep ran about a quarter slower.
    ///
    /// Invariant: the packed copies are not updated by later changes of the `Var`s (an optimizer
    /// step); call `unpack_weights` (or `pack_weights` again) after changing weights. A backward
    /// pass through packed weights is an error, never a silent wrong gradient. `snapshot` and
    /// `to_dtype` copies start unpacked. Only f32 CPU weights are packed.
    pub fn pack_weights(&mut self) -> Result<(), ModelError> {
        self.precision = Precision::Bf16;
        if self.inference_only {
            // Already packed, and its f32 linear weights are placeholders.
            return Ok(());
        }
        if self.device().is_cpu() && self.dtype() == DType::F32 {
            // The old copies go first: a region lives until its last matrix is dropped, so
            // replacing them one by one would hold both regions at once.
            self.unpack_weights();
            let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens).clone();
            let weights: Vec<Tensor> = self.linears_mut().map(|l| l.weight.clone()).collect();
            let region = packing_region(weights.iter().chain([&head]))?;
            for linear in self.linears_mut() {
                linear.packed = Some(pack(&linear.weight, region.as_ref())?);
            }
            self.packed_head = Some(pack(&head, region.as_ref())?);
        }
        Ok(())
    }

    /// Drops the packed bf16 copies (`pack_weights`); the precision stays as it is. Does nothing
    /// to an `inference_copy`.
    pub fn unpack_weights(&mut self) {
        if self.inference_only {
            // The packed weights are an inference copy's only linear weights.
            return;
        }
        for linear in self.linears_mut() {
            linear.packed = None;
        }
        self.packed_head = None;
    }

    /// Bytes held by packed bf16 weights (0 unless `pack_weights` ran).
    pub fn packed_weight_bytes(&self) -> usize {
        let head = self.packed_head.as_ref().map_or(0, |p| p.bytes());
        self.layers
            .iter()
            .chain(self.mtp.iter().map(|m| &m.block))
            .flat_map(DecoderLayer::linears)
            .chain(self.mtp.iter().map(|m| &m.eh_proj))
            .filter_map(|linear| linear.packed.as_ref())
            .map(|p| p.bytes())
            .sum::<usize>()
            + head
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
                Some(Arc::new(crate::fused_block::FusedInputs::new(
                    &cos, &sin, &bias,
                )?))
            }
            Some(_)
                if prefill
                    && self.fused_blocks
                    && self.device().is_cpu()
                    && matches!(dtype, DType::F32 | DType::F64) =>
            {
                Some(Arc::new(crate::fused_block::FusedInputs::new(
                    &cos, &sin, &bias,
                )?))
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
            fused: if record.max_logits { None } else { fused },
            cache_offset: 0,
        });
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
            let fused = context
                .fused
                .as_ref()
                .filter(|_| crate::fused_block::applies(layer, &hidden));
            hidden = if let (Some(inputs), Some(cache)) = (fused, cache.as_deref_mut()) {
                // Prefill: the keys and values go to the cache; inference only, off the graph.
                let (y, k, v) = crate::fused_block::forward_with_kv(
                    layer,
                    &hidden,
                    inputs,
                    block_shape,
                    self.precision,
                )?;
                cache.append(index, &k, &v)?;
                y
            } else if let Some(inputs) = fused {
                crate::fused_block::forward(
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
            fused: None,
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
    fn stored_expert_bias_name(&self, layer: usize) -> Option<String> {
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

    /// LM head on hidden states [..., hidden] -> logits [..., vocab].
    pub fn lm_logits(&self, hidden: &Tensor) -> Result<Tensor, ModelError> {
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

impl DecoderLayer {
    /// Every variable the block reads (norms, linear weights, biases and adapters, q/k norms);
    /// frozen tensors are not variables and are left out.
    fn vars(&self) -> Vec<Tensor> {
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
    fn freeze(&mut self) {
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

    fn forward(
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

impl SelfAttention {
    fn forward(
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

impl LatentAttention {
    /// MLA as DeepseekV3Attention computes it. Without a cache (training, scoring) the latent is
    /// expanded into every head's keys and values. With one, the cache stores the normed latent
    /// and the rotated shared key, and attention runs in the latent space with the absorbed
    /// weights: each head's unrotated query is multiplied into the latent by its slice of
    /// `kv_b_proj` (W_uk), scores are `q_lat · latent + q_rot · k_rot`, and the attended
    /// latent leaves through the head's value slice (W_uv). Both are the same sums in a
    /// different order.
    fn forward(
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

/// Per attention layer: the layer and each query head's largest logit.
pub type LayerLogits = Vec<(usize, Vec<f32>)>;

/// What `forward_hidden_recorded` records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Record {
    /// The MoE layers' routing.
    pub routing: bool,
    /// Each attention layer's per-query-head largest logit.
    pub max_logits: bool,
}

/// What a recorded forward pass saw.
#[derive(Debug, Clone, Default)]
pub struct ForwardRecord {
    pub routings: Vec<Routing>,
    /// Per attention layer (in order): the layer and each query head's largest logit.
    pub max_logits: Vec<(usize, Vec<f32>)>,
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

/// A weight `[out, in]` in bf16 for inference (`pack_weights`, `inference_copy`), in `region`
/// where there is one.
fn pack(weight: &Tensor, region: Option<&Arc<PageRegion>>) -> Result<Arc<PackedA>, ModelError> {
    let (n, k) = weight.dims2()?;
    let values: Vec<f32> = weight.flatten_all()?.to_vec1()?;
    Ok(Arc::new(PackedA::from_rows_in(&values, n, k, region)))
}

/// One region of huge pages for a model's packed weights (decoding streams them all every step;
/// see `stoke_ops::pages`), sized for `weights` (each `[out, in]`). `None` where the platform has
/// none: the weights then go on the heap.
fn packing_region<'a>(
    weights: impl Iterator<Item = &'a Tensor>,
) -> Result<Option<Arc<PageRegion>>, ModelError> {
    let mut words = 0;
    for weight in weights {
        let (n, k) = weight.dims2()?;
        words += PageRegion::words_for(PackedA::words(n, k));
    }
    Ok(PageRegion::new(words))
}

/// Box-Muller transform: one N(0, 1) sample from two uniforms.
fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
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

    fn stats(values: &[f32]) -> (f64, f64) {
        let n = values.len() as f64;
        let std = (values.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n).sqrt();
        let max = values.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
        (std, max)
    }

    /// Every packed weight of a model sits in one huge-page region (decoding streams them all
    /// each step), which holds exactly them; an inference copy gets its own. Linux/glibc only.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn packed_weights_share_one_region_sized_for_them() {
        let mut model = tiny_model();
        model.pack_weights().expect("pack");
        let copy = model.inference_copy().expect("copy");
        for m in [&model, &copy] {
            let packed: Vec<&Arc<PackedA>> = m
                .layers
                .iter()
                .flat_map(DecoderLayer::linears)
                .filter_map(|l| l.packed.as_ref())
                .chain(m.packed_head.as_ref())
                .collect();
            assert_eq!(packed.len(), 7 + 1);
            let region = packed[0].region().expect("in a region");
            assert!(
                packed
                    .iter()
                    .all(|p| p.region().is_some_and(|r| Arc::ptr_eq(r, region)))
            );
            let words: usize = packed
                .iter()
                .map(|p| PageRegion::words_for(p.bytes() / 4))
                .sum();
            assert_eq!(region.used(), words, "the region holds the packed weights");
        }
        let region = |m: &Transformer| {
            Arc::clone(
                m.packed_head
                    .as_ref()
                    .and_then(|p| p.region())
                    .expect("region"),
            )
        };
        assert!(!Arc::ptr_eq(&region(&model), &region(&copy)));
    }

    #[test]
    fn init_schemes_draw_the_stated_distributions() {
        let json = r#"{
            "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 256,
            "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4,
            "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "tie_word_embeddings": true
        }"#;
        let config = ModelConfig::from_json_str(json, Path::new("<test>")).expect("config");
        let draw =
            |scheme| Transformer::init_with(config.clone(), &Device::Cpu, 7, scheme).expect("init");
        let all = |m: &Transformer| -> Vec<(String, Vec<f32>)> {
            m.parameters()
                .iter()
                .map(|(n, v)| (n.clone(), values(v)))
                .collect()
        };
        // The default scheme is `init`, draw for draw.
        let plain = Transformer::init(config.clone(), &Device::Cpu, 7).expect("init");
        assert_eq!(all(&draw(InitScheme::default())), all(&plain));
        // A standard normal cut at ±3 has standard deviation 0.98658.
        let cut = 0.98658;
        let truncated = draw(InitScheme::TruncatedNormal { std: 0.02 });
        let scaled = draw(InitScheme::Scaled);
        let base = 1.0 / 16.0;
        for (name, w) in all(&truncated) {
            if name.ends_with("norm.weight") {
                assert!(w.iter().all(|&v| v == 1.0));
                continue;
            }
            let (std, max) = stats(&w);
            assert!(max <= 3.0 * 0.02 + 1e-9, "{name}: {max} past 3 std");
            assert!((std / (0.02 * cut) - 1.0).abs() < 0.03, "{name}: std {std}");
        }
        for (name, w) in all(&scaled) {
            if name.ends_with("norm.weight") {
                continue;
            }
            let expected = if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")
            {
                base / 4.0 // sqrt(2 x 8 layers)
            } else {
                base
            };
            let (std, max) = stats(&w);
            assert!(max <= 3.0 * expected + 1e-9, "{name}: {max} past 3 std");
            assert!(
                (std / (expected * cut) - 1.0).abs() < 0.03,
                "{name}: std {std} vs {expected}"
            );
        }
        // Seeded: the same seed draws the same model.
        assert_eq!(all(&draw(InitScheme::Scaled)), all(&scaled));
    }

    /// DeepSeek-V3's group limit, by hand: groups of 2 scored by their two scores' sum
    /// (1.0, 0.95, 1.0, 0.6); the best 2 (groups 0 and 2) stay, the others are masked.
    #[test]
    fn the_group_limit_keeps_the_best_groups_by_their_top_two_sum() {
        let mut scores = [0.9f32, 0.1, 0.5, 0.45, 0.2, 0.8, 0.3, 0.3];
        let limit = crate::config::GroupLimit {
            groups: 4,
            topk_groups: 2,
        };
        mask_weak_groups(&mut scores, limit);
        let inf = f32::NEG_INFINITY;
        assert_eq!(scores, [0.9, 0.1, inf, inf, 0.2, 0.8, inf, inf]);
        // Groups of 4 scored by their best two only (not the sum of all four).
        let mut scores = [0.5f32, 0.5, 0.0, 0.0, 0.4, 0.4, 0.4, 0.4];
        mask_weak_groups(
            &mut scores,
            crate::config::GroupLimit {
                groups: 2,
                topk_groups: 1,
            },
        );
        assert_eq!(scores, [0.5, 0.5, 0.0, 0.0, inf, inf, inf, inf]);
    }

    #[test]
    fn sandwich_post_norms_start_at_a_gain_of_sqrt_half() {
        let moe = r#", "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8"#;
        for (model_type, offset, extra) in [("gemma2", true, ""), ("afmoe", false, moe)] {
            let json = format!(
                r#"{{"model_type": "{model_type}", "vocab_size": 37, "hidden_size": 16,
                "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 8{extra}}}"#
            );
            let config = ModelConfig::from_json_str(&json, Path::new("<test>")).expect("config");
            let model = Transformer::init(config, &Device::Cpu, 3).expect("init");
            let mut seen = 0;
            for (name, var) in model.parameters() {
                if !name.ends_with("norm.weight") {
                    continue;
                }
                let post = name.contains("post_attention_layernorm")
                    || name.contains("post_feedforward_layernorm")
                    || name.contains("post_mlp_layernorm");
                let gain = if post { 0.5f32.sqrt() } else { 1.0 };
                let stored = if offset { gain - 1.0 } else { gain };
                assert!(
                    values(&var).iter().all(|&v| (v - stored).abs() < 1e-7),
                    "{model_type}: {name}"
                );
                seen += usize::from(post);
            }
            assert_eq!(seen, 4, "{model_type}: two post norms per layer");
        }
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
