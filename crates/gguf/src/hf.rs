//! Translation between a GGUF file and the Hugging Face folder layout, the way transformers 5.24's
//! GGUF loader does it (`modeling_gguf_pytorch_utils.py`, `integrations/ggml.py`,
//! `integrations/gguf/gguf_tokenizer_mapping.py`), so a model loaded from GGUF by stoke is the
//! model transformers loads from the same file:
//!
//! - `config.json` from the `{arch}.*` keys (llama, qwen2, qwen3; the mixtures of experts
//!   qwen2moe, qwen3moe, olmoe, Mixtral as llama with `expert_count`, and DeepSeek-V3 as
//!   deepseek2, which transformers' GGUF loader does not read: there stoke follows llama.cpp's
//!   converter, see [`DEEPSEEK2`]);
//! - tensor names (`blk.N.attn_q.weight` <-> `model.layers.N.self_attn.q_proj.weight`), and for
//!   llama the inverse of llama.cpp's q/k row permutation (its RoPE pairs adjacent values where
//!   transformers pairs the two halves of a head);
//! - `tokenizer.json` and `tokenizer_config.json` from the `tokenizer.*` keys: byte-level BPE
//!   (`tokenizer.ggml.model = "gpt2"`) with the pre-tokenizer split its `tokenizer.ggml.pre`
//!   names, control tokens as special added tokens, the chat template and the special tokens.
//!
//! - llama.cpp's stacked expert tensors (`ffn_{gate,up,down}_exps`, [experts, out, in]), which
//!   the model loader splits per expert and the exporter stacks again ([`EXPERT_TENSORS`]).
//!
//! And back, for `stoke export --gguf`: the metadata llama.cpp reads for those architectures,
//! the vocabulary and merges from `tokenizer.json`, and the forward permutation.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value as Json, json};

use crate::error::GgufError;
use crate::read::{GgufFile, Value};

/// Dense architectures (`general.architecture`) stoke loads and exports, with their transformers
/// class.
pub const ARCHITECTURES: [(&str, &str); 3] = [
    ("llama", "LlamaForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "Qwen3ForCausalLM"),
];

/// Mixture-of-experts architectures stoke loads and exports: llama.cpp's name, the
/// transformers class and model type.
/// llama.cpp stores Mixtral as `llama` with `llama.expert_count` (see [`hf_config`]), and
/// DeepSeek-V3 as `deepseek2` (MLA, sigmoid routing; see [`DEEPSEEK2`]).
pub const MOE_ARCHITECTURES: [(&str, &str, &str); 4] = [
    ("qwen2moe", "Qwen2MoeForCausalLM", "qwen2_moe"),
    ("qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe"),
    ("olmoe", "OlmoeForCausalLM", "olmoe"),
    (DEEPSEEK2, "DeepseekV3ForCausalLM", "deepseek_v3"),
];

/// llama.cpp's architecture for DeepSeek-V2/V3 (multi-head latent attention). Its converter
/// (`DeepseekV2Model` in `convert_hf_to_gguf.py`) writes the attention as MQA over the latent:
/// `attention.head_count_kv` 1, `attention.key_length` kv_lora_rank + qk_rope_head_dim and
/// `attention.value_length` kv_lora_rank, with the per-head sizes in
/// `attention.key_length_mla` / `attention.value_length_mla`. It splits `kv_b_proj` into
/// [`MLA_K_B`] and [`MLA_V_B`] for the absorbed decode, and leaves out the multi-token
/// prediction layers. Its RoPE pairs adjacent values, which is transformers'
/// `rope_interleave = true`.
pub const DEEPSEEK2: &str = "deepseek2";

/// `kv_b_proj`'s key half per head, transposed: `[heads, kv_lora_rank, qk_nope_head_dim]`.
pub const MLA_K_B: &str = "attn_k_b";
/// `kv_b_proj`'s value half per head: `[heads, v_head_dim, kv_lora_rank]`.
pub const MLA_V_B: &str = "attn_v_b";

/// llama.cpp's stacked expert tensors (`blk.N.ffn_{gate,up,down}_exps.weight`, [experts, out,
/// in]) and the per-expert transformers module each slice becomes.
pub const EXPERT_TENSORS: [(&str, &str); 3] = [
    ("ffn_gate_exps", "gate_proj"),
    ("ffn_up_exps", "up_proj"),
    ("ffn_down_exps", "down_proj"),
];

/// `(layer, projection)` when `name` is a stacked expert tensor (`blk.3.ffn_up_exps.weight` ->
/// `(3, "up_proj")`).
pub fn expert_tensor(name: &str) -> Option<(usize, &'static str)> {
    let rest = name.strip_prefix("blk.")?.strip_suffix(".weight")?;
    let (layer, suffix) = rest.split_once('.')?;
    let (_, proj) = EXPERT_TENSORS.iter().find(|(g, _)| *g == suffix)?;
    Some((layer.parse().ok()?, proj))
}

/// Per-block tensor names: GGUF suffix -> transformers suffix.
const BLOCK_TENSORS: [(&str, &str); 22] = [
    ("ffn_gate_inp", "mlp.gate"),
    ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
    ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
    ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    // Multi-head latent attention (deepseek2).
    ("attn_q_a", "self_attn.q_a_proj"),
    ("attn_q_a_norm", "self_attn.q_a_layernorm"),
    ("attn_q_b", "self_attn.q_b_proj"),
    ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
    ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
    ("attn_kv_b", "self_attn.kv_b_proj"),
];

/// DeepSeek-V3's names where they differ from the Qwen families' (`deepseek2`): its shared
/// experts are `mlp.shared_experts`, and its selection bias is a bare parameter of the router.
const DEEPSEEK2_TENSORS: [(&str, &str); 4] = [
    (
        "ffn_gate_shexp.weight",
        "mlp.shared_experts.gate_proj.weight",
    ),
    ("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
    (
        "ffn_down_shexp.weight",
        "mlp.shared_experts.down_proj.weight",
    ),
    ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
];

const GLOBAL_TENSORS: [(&str, &str); 3] = [
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
];

/// The transformers name of GGUF tensor `name` in a file of architecture `arch`, if it is one
/// stoke maps.
pub fn hf_tensor_name(arch: &str, name: &str) -> Option<String> {
    if arch == DEEPSEEK2
        && let Some((layer, suffix)) = block_suffix(name, "blk.")
        && let Some((_, hf)) = DEEPSEEK2_TENSORS.iter().find(|(g, _)| *g == suffix)
    {
        return Some(format!("model.layers.{layer}.{hf}"));
    }
    let (stem, kind) = name.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    if let Some((_, hf)) = GLOBAL_TENSORS.iter().find(|(g, _)| *g == stem) {
        return Some(format!("{hf}.{kind}"));
    }
    let rest = stem.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (_, hf) = BLOCK_TENSORS.iter().find(|(g, _)| *g == suffix)?;
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// `(layer, rest)` of a per-block tensor name (`blk.3.attn_q.weight` -> `(3, "attn_q.weight")`
/// with `prefix` `blk.`).
fn block_suffix<'a>(name: &'a str, prefix: &str) -> Option<(usize, &'a str)> {
    let (layer, suffix) = name.strip_prefix(prefix)?.split_once('.')?;
    Some((layer.parse().ok()?, suffix))
}

/// The GGUF name of transformers tensor `name` for architecture `arch`, if it is one stoke maps.
pub fn gguf_tensor_name(arch: &str, name: &str) -> Option<String> {
    if arch == DEEPSEEK2
        && let Some((layer, suffix)) = block_suffix(name, "model.layers.")
        && let Some((g, _)) = DEEPSEEK2_TENSORS.iter().find(|(_, hf)| *hf == suffix)
    {
        return Some(format!("blk.{layer}.{g}"));
    }
    let (stem, kind) = name.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    if let Some((g, _)) = GLOBAL_TENSORS.iter().find(|(_, hf)| *hf == stem) {
        return Some(format!("{g}.{kind}"));
    }
    let rest = stem.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (g, _) = BLOCK_TENSORS.iter().find(|(_, hf)| *hf == suffix)?;
    Some(format!("blk.{layer}.{g}.{kind}"))
}

/// Which rotation a q/k tensor needs between the two layouts: `Some(heads)` for llama's q
/// (`num_attention_heads`) and k (`num_key_value_heads`) weights and biases, `None` otherwise.
pub fn permuted_heads(architecture: &str, hf_name: &str, config: &Json) -> Option<usize> {
    if architecture != "llama" {
        return None;
    }
    let key = if hf_name.contains(".self_attn.q_proj.") {
        "num_attention_heads"
    } else if hf_name.contains(".self_attn.k_proj.") {
        "num_key_value_heads"
    } else {
        return None;
    };
    config.get(key).and_then(Json::as_u64).map(|h| h as usize)
}

/// Reorders the rows of a q/k projection (`rows x cols`, row-major) between llama.cpp's layout
/// (adjacent pairs) and transformers' (half-split), per head. `to_gguf` picks the direction:
/// llama.cpp's `permute` when true, transformers' `reverse_permute_weights` when false.
pub fn permute_rows(
    values: &[f32],
    rows: usize,
    heads: usize,
    to_gguf: bool,
) -> Result<Vec<f32>, String> {
    if heads == 0 || !rows.is_multiple_of(heads) {
        return Err(format!(
            "{rows} rows cannot be split into {heads} heads of rotary pairs"
        ));
    }
    let block = rows / heads;
    permute_rotary_rows(values, rows, block, 0, block, to_gguf)
}

/// [`permute_rows`] for the rotary part of each `block` of rows: rows `offset..offset + rope`
/// of every block move between the half-split and the adjacent-pairs layout, the rest stay.
/// (DeepSeek's MLA rotates only the last `qk_rope_head_dim` rows of each query head and of the
/// latent projection.)
pub fn permute_rotary_rows(
    values: &[f32],
    rows: usize,
    block: usize,
    offset: usize,
    rope: usize,
    to_gguf: bool,
) -> Result<Vec<f32>, String> {
    if block == 0
        || rows == 0
        || !rows.is_multiple_of(block)
        || !rope.is_multiple_of(2)
        || offset + rope > block
        || !values.len().is_multiple_of(rows)
    {
        return Err(format!(
            "{rows} rows cannot be split into blocks of {block} with {rope} rotary rows from row \
             {offset}"
        ));
    }
    let cols = values.len() / rows;
    let half = rope / 2;
    let mut out = values.to_vec();
    for b in 0..rows / block {
        let base = b * block + offset;
        for i in 0..half {
            for pair in 0..2 {
                // transformers row (pair, i) <-> llama.cpp row (i, pair).
                let hf_row = base + pair * half + i;
                let gguf_row = base + 2 * i + pair;
                let (from, to) = if to_gguf {
                    (hf_row, gguf_row)
                } else {
                    (gguf_row, hf_row)
                };
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&values[from * cols..(from + 1) * cols]);
            }
        }
    }
    Ok(out)
}

/// The sizes of MLA's `kv_b_proj` (`[heads * (nope + value), rank]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvB {
    pub heads: usize,
    /// `qk_nope_head_dim`.
    pub nope: usize,
    /// `v_head_dim`.
    pub value: usize,
    /// `kv_lora_rank`.
    pub rank: usize,
}

impl KvB {
    /// llama.cpp's two tensors from `kv_b_proj`: [`MLA_K_B`] `[heads, rank, nope]` (each head's
    /// key rows, transposed) and [`MLA_V_B`] `[heads, value, rank]`.
    pub fn split(&self, kv_b: &[f32]) -> Result<(Vec<f32>, Vec<f32>), String> {
        let KvB {
            heads,
            nope,
            value,
            rank,
        } = *self;
        if kv_b.len() != heads * (nope + value) * rank {
            return Err(format!(
                "kv_b_proj has {} values, not heads {heads} x (nope {nope} + value {value}) x \
                 rank {rank}",
                kv_b.len()
            ));
        }
        let mut k_b = vec![0f32; heads * rank * nope];
        let mut v_b = Vec::with_capacity(heads * value * rank);
        for h in 0..heads {
            let head = &kv_b[h * (nope + value) * rank..(h + 1) * (nope + value) * rank];
            for n in 0..nope {
                for r in 0..rank {
                    k_b[(h * rank + r) * nope + n] = head[n * rank + r];
                }
            }
            v_b.extend_from_slice(&head[nope * rank..]);
        }
        Ok((k_b, v_b))
    }

    /// `kv_b_proj` from llama.cpp's [`MLA_K_B`] and [`MLA_V_B`] (the inverse of [`KvB::split`]).
    pub fn join(&self, k_b: &[f32], v_b: &[f32]) -> Result<Vec<f32>, String> {
        let KvB {
            heads,
            nope,
            value,
            rank,
        } = *self;
        if k_b.len() != heads * rank * nope || v_b.len() != heads * value * rank {
            return Err(format!(
                "{MLA_K_B} / {MLA_V_B} have {} / {} values, not heads {heads} x rank {rank} x \
                 nope {nope} / heads x value {value} x rank",
                k_b.len(),
                v_b.len()
            ));
        }
        let mut kv_b = Vec::with_capacity(heads * (nope + value) * rank);
        for h in 0..heads {
            for n in 0..nope {
                kv_b.extend((0..rank).map(|r| k_b[(h * rank + r) * nope + n]));
            }
            kv_b.extend_from_slice(&v_b[h * value * rank..(h + 1) * value * rank]);
        }
        Ok(kv_b)
    }
}

fn unsupported(file: &GgufFile, key: &str, value: &str, supported: &str) -> GgufError {
    GgufError::Unsupported {
        path: file.path().to_path_buf(),
        key: key.into(),
        value: value.into(),
        supported: supported.into(),
    }
}

/// The architecture (`general.architecture`), checked to be one stoke loads.
pub fn architecture(file: &GgufFile) -> Result<&str, GgufError> {
    let key = "general.architecture";
    let arch = file.str(key)?.ok_or_else(|| file.missing(key))?;
    if !ARCHITECTURES.iter().any(|(a, _)| *a == arch)
        && !MOE_ARCHITECTURES.iter().any(|(a, _, _)| *a == arch)
    {
        let supported: Vec<&str> = ARCHITECTURES
            .iter()
            .map(|(a, _)| *a)
            .chain(MOE_ARCHITECTURES.iter().map(|(a, _, _)| *a))
            .collect();
        return Err(unsupported(
            file,
            key,
            &format!("{arch:?}"),
            &supported.join(", "),
        ));
    }
    Ok(arch)
}

/// The tensor in which llama.cpp stores Llama 3's RoPE scaling: one factor per frequency, by which
/// it divides the default frequency. transformers' GGUF loader ignores it; stoke's model loader
/// recovers the `llama3` rope parameters from it (`stoke_model::gguf`).
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// transformers' `config.json` for the model in `file` (without the rope scaling that a
/// `rope_freqs.weight` tensor encodes; see [`ROPE_FREQS`]).
pub fn hf_config(file: &GgufFile) -> Result<Json, GgufError> {
    let arch = architecture(file)?;
    // Mixtral is llama.cpp's `llama` with experts.
    let mixtral = arch == "llama" && file.uint("llama.expert_count")?.is_some_and(|n| n > 0);
    let (class, model_type) = match MOE_ARCHITECTURES.iter().find(|(a, _, _)| *a == arch) {
        Some((_, class, model_type)) => (Some(*class), *model_type),
        None if mixtral => (Some("MixtralForCausalLM"), "mixtral"),
        None => (
            ARCHITECTURES
                .iter()
                .find(|(a, _)| *a == arch)
                .map(|(_, c)| *c),
            arch,
        ),
    };
    let key = |suffix: &str| format!("{arch}.{suffix}");
    let required = |suffix: &str| -> Result<u64, GgufError> {
        let k = key(suffix);
        file.uint(&k)?.ok_or_else(|| file.missing(&k))
    };
    let hidden = required("embedding_length")?;
    let heads = required("attention.head_count")?;
    let kv_heads = file.uint(&key("attention.head_count_kv"))?.unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(GgufError::Malformed {
            path: file.path().to_path_buf(),
            what: format!("metadata key `{}`", key("attention.head_count_kv")),
            message: format!("{kv_heads} key/value heads do not divide {heads} attention heads"),
        });
    }
    let vocab = match file.uint(&key("vocab_size"))? {
        Some(v) => v,
        None => match file.tensor_info("token_embd.weight") {
            Some(info) => info.shape[0] as u64,
            None => return Err(file.missing(&key("vocab_size"))),
        },
    };
    let mut config = Map::new();
    config.insert("architectures".into(), json!([class]));
    config.insert("model_type".into(), json!(model_type));
    config.insert("vocab_size".into(), json!(vocab));
    config.insert("hidden_size".into(), json!(hidden));
    config.insert(
        "intermediate_size".into(),
        json!(required("feed_forward_length")?),
    );
    config.insert("num_hidden_layers".into(), json!(required("block_count")?));
    config.insert("num_attention_heads".into(), json!(heads));
    config.insert("num_key_value_heads".into(), json!(kv_heads));
    // transformers reads `rope.dimension_count` as head_dim for llama; `attention.key_length` is
    // llama.cpp's own head size key (Qwen3 has head_dim 128 whatever the hidden size).
    let head_dim = match file.uint(&key("attention.key_length"))? {
        Some(d) => Some(d),
        None if arch == "llama" => file.uint(&key("rope.dimension_count"))?,
        None => None,
    };
    if let Some(d) = head_dim {
        config.insert("head_dim".into(), json!(d));
    }
    if let Some(eps) = file.float(&key("attention.layer_norm_rms_epsilon"))? {
        config.insert("rms_norm_eps".into(), json!(eps as f32 as f64));
    }
    config.insert(
        "rope_theta".into(),
        json!(file.float(&key("rope.freq_base"))?.unwrap_or(10_000.0)),
    );
    if let Some(context) = file.uint(&key("context_length"))? {
        config.insert("max_position_embeddings".into(), json!(context));
    }
    if let Some(scaling) = rope_scaling(file, arch)? {
        config.insert("rope_scaling".into(), scaling);
    }
    config.insert(
        "tie_word_embeddings".into(),
        json!(file.tensor_info("output.weight").is_none()),
    );
    if mixtral {
        // Mixtral's experts are `intermediate_size` wide (llama.cpp's feed_forward_length).
        config.insert("num_local_experts".into(), json!(required("expert_count")?));
        config.insert(
            "num_experts_per_tok".into(),
            json!(required("expert_used_count")?),
        );
    }
    if arch == "olmoe"
        && let Some(clamp) = file.float(&key("attention.clamp_kqv"))?
    {
        config.insert("clip_qkv".into(), json!(clamp));
    }
    if arch == DEEPSEEK2 {
        deepseek2_config(file, &mut config)?;
    } else if MOE_ARCHITECTURES.iter().any(|(a, _, _)| *a == arch) {
        // llama.cpp's expert keys. transformers' GGUF loader reads only the two counts and takes
        // the expert widths from its config defaults; stoke reads the widths the file states.
        config.insert("num_experts".into(), json!(required("expert_count")?));
        config.insert(
            "num_experts_per_tok".into(),
            json!(required("expert_used_count")?),
        );
        // (OLMoE's experts are `intermediate_size` wide, llama.cpp's feed_forward_length.)
        if let Some(width) = file.uint(&key("expert_feed_forward_length"))?
            && arch != "olmoe"
        {
            config.insert("moe_intermediate_size".into(), json!(width));
        }
        if let Some(width) = file.uint(&key("expert_shared_feed_forward_length"))? {
            config.insert("shared_expert_intermediate_size".into(), json!(width));
        }
        // llama.cpp renormalizes Qwen3-MoE's top-k weights and not Qwen2-MoE's (transformers'
        // GGUF_CONFIG_DEFAULTS_MAPPING says the same for qwen3_moe).
        config.insert("norm_topk_prob".into(), json!(arch == "qwen3moe"));
        if arch == "qwen2moe" {
            config.insert(
                "qkv_bias".into(),
                json!(file.tensor_info("blk.0.attn_q.bias").is_some()),
            );
        }
    }
    if arch == "llama" {
        let bias = file.tensor_info("blk.0.attn_q.bias").is_some();
        config.insert("attention_bias".into(), json!(bias));
        let mlp_bias = file.tensor_info("blk.0.ffn_up.bias").is_some();
        config.insert("mlp_bias".into(), json!(mlp_bias));
    }
    for (gguf, hf) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ] {
        if let Some(id) = file.uint(gguf)? {
            config.insert(hf.into(), json!(id));
        }
    }
    config.insert("hidden_act".into(), json!("silu"));
    Ok(Json::Object(config))
}

/// DeepSeek-V3's fields from a `deepseek2` file (see [`DEEPSEEK2`] for how llama.cpp lays out
/// MLA), replacing the MQA view the generic keys give.
fn deepseek2_config(file: &GgufFile, config: &mut Map<String, Json>) -> Result<(), GgufError> {
    let arch = DEEPSEEK2;
    let key = |suffix: &str| format!("{arch}.{suffix}");
    let required = |suffix: &str| -> Result<u64, GgufError> {
        let k = key(suffix);
        file.uint(&k)?.ok_or_else(|| file.missing(&k))
    };
    let gating = key("expert_gating_func");
    match file.uint(&gating)? {
        // 2 is llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (DeepSeek-V3); DeepSeek-V2's
        // softmax (1, or the key absent) is a different router.
        Some(2) => {}
        other => {
            return Err(unsupported(
                file,
                &gating,
                &other.map_or("absent (softmax)".into(), |v| v.to_string()),
                "2 (sigmoid, DeepSeek-V3; DeepSeek-V2's softmax router is not built)",
            ));
        }
    }
    let heads = required("attention.head_count")?;
    let rope = required("rope.dimension_count")?;
    let kv_lora_rank = required("attention.kv_lora_rank")?;
    // Older converters wrote the per-head sizes as key_length / value_length.
    let (qk, value) = match file.uint(&key("attention.key_length_mla"))? {
        Some(qk) => (qk, required("attention.value_length_mla")?),
        None => (
            required("attention.key_length")?,
            required("attention.value_length")?,
        ),
    };
    if qk <= rope {
        return Err(GgufError::Malformed {
            path: file.path().to_path_buf(),
            what: format!("metadata key `{}`", key("attention.key_length_mla")),
            message: format!(
                "a query/key head of {qk} leaves nothing beside its {rope} rotary dimensions"
            ),
        });
    }
    config.remove("head_dim");
    config.insert("num_key_value_heads".into(), json!(heads));
    config.insert("qk_rope_head_dim".into(), json!(rope));
    config.insert("qk_nope_head_dim".into(), json!(qk - rope));
    config.insert("v_head_dim".into(), json!(value));
    config.insert("kv_lora_rank".into(), json!(kv_lora_rank));
    config.insert(
        "q_lora_rank".into(),
        json!(file.uint(&key("attention.q_lora_rank"))?),
    );
    config.insert("rope_interleave".into(), json!(true));
    config.insert(
        "first_k_dense_replace".into(),
        json!(file.uint(&key("leading_dense_block_count"))?.unwrap_or(0)),
    );
    config.insert("n_routed_experts".into(), json!(required("expert_count")?));
    config.insert(
        "num_experts_per_tok".into(),
        json!(required("expert_used_count")?),
    );
    config.insert(
        "moe_intermediate_size".into(),
        json!(required("expert_feed_forward_length")?),
    );
    config.insert(
        "n_shared_experts".into(),
        json!(file.uint(&key("expert_shared_count"))?.unwrap_or(0)),
    );
    config.insert(
        "routed_scaling_factor".into(),
        json!(file.float(&key("expert_weights_scale"))?.unwrap_or(1.0) as f32 as f64),
    );
    config.insert(
        "norm_topk_prob".into(),
        json!(file.bool(&key("expert_weights_norm"))?.unwrap_or(false)),
    );
    config.insert(
        "n_group".into(),
        json!(file.uint(&key("expert_group_count"))?.unwrap_or(1)),
    );
    config.insert(
        "topk_group".into(),
        json!(file.uint(&key("expert_group_used_count"))?.unwrap_or(1)),
    );
    // llama.cpp leaves the multi-token prediction layers out of deepseek2 files.
    config.insert("num_nextn_predict_layers".into(), json!(0));
    Ok(())
}

fn rope_scaling(file: &GgufFile, arch: &str) -> Result<Option<Json>, GgufError> {
    let key = format!("{arch}.rope.scaling.type");
    let Some(kind) = file.str(&key)? else {
        return Ok(None);
    };
    let factor = file.float(&format!("{arch}.rope.scaling.factor"))?;
    match kind {
        "none" => Ok(None),
        "linear" => Ok(Some(
            json!({"rope_type": "linear", "factor": factor.unwrap_or(1.0)}),
        )),
        "yarn" => {
            let original = file.uint(&format!("{arch}.rope.scaling.original_context_length"))?;
            let original = original.ok_or_else(|| {
                file.missing(&format!("{arch}.rope.scaling.original_context_length"))
            })?;
            let mut scaling = json!({
                "rope_type": "yarn",
                "factor": factor,
                "original_max_position_embeddings": original,
            });
            // deepseek2: llama.cpp scales the attention by (1 + log_mul · ln factor)² and keeps
            // the rotation's own factor at 1, which is transformers' DeepSeek-V3 with
            // mscale = mscale_all_dim = log_mul / 0.1.
            if arch == DEEPSEEK2
                && let Some(log_mul) =
                    file.float(&format!("{arch}.rope.scaling.yarn_log_multiplier"))?
            {
                let mscale = (log_mul as f32 / 0.1) as f64;
                scaling["mscale"] = json!(mscale);
                scaling["mscale_all_dim"] = json!(mscale);
                // llama.cpp's YaRN ramp, unless the file states its own.
                for (name, default) in [("beta_fast", 32.0), ("beta_slow", 1.0)] {
                    let stated = file.float(&format!("{arch}.rope.scaling.yarn_{name}"))?;
                    scaling[name] = json!(stated.unwrap_or(default));
                }
            }
            Ok(Some(scaling))
        }
        other => Err(unsupported(
            file,
            &key,
            &format!("{other:?}"),
            "none, linear, yarn",
        )),
    }
}

/// GPT-2's byte -> printable character table (`bytes_to_unicode`).
fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap_or('\0')
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap_or('\0')
        };
    }
    table
}

/// A token as a byte-level vocabulary spells it: as written when every character is in GPT-2's
/// byte alphabet, else its UTF-8 bytes through that alphabet (transformers' `byte_level_tokenizer`).
fn byte_level_spelling(token: &str) -> String {
    let alphabet = byte_alphabet();
    let in_alphabet = token.chars().all(|c| alphabet.contains(&c));
    if in_alphabet {
        token.to_string()
    } else {
        token.bytes().map(|b| alphabet[b as usize]).collect()
    }
}

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const CL100K_SPLIT: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// transformers' `GGUF_PRE_TOKENIZER_SPLITS`: the split regex a `tokenizer.ggml.pre` names. Any
/// other name keeps GPT-2's byte-level pre-tokenizer, as transformers does.
fn pre_tokenizer_split(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "qwen35" => QWEN35_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// llama.cpp token types.
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// Key in the written `tokenizer_config.json` that keeps the file's `tokenizer.ggml.pre`, so an
/// export back to GGUF names the same pre-tokenizer.
pub const PRE_TOKENIZER_KEY: &str = "gguf_pre_tokenizer";

/// `tokenizer.json` and `tokenizer_config.json` for the tokenizer in `file`'s metadata.
pub fn tokenizer_files(file: &GgufFile) -> Result<(Json, Map<String, Json>), GgufError> {
    let model_key = "tokenizer.ggml.model";
    let kind = file
        .str(model_key)?
        .ok_or_else(|| file.missing(model_key))?;
    if kind != "gpt2" && kind != "llama" {
        return Err(unsupported(
            file,
            model_key,
            &format!("{kind:?}"),
            "\"gpt2\" (byte-level BPE), \"llama\" (SentencePiece BPE)",
        ));
    }
    let tokens = file
        .strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| file.missing("tokenizer.ggml.tokens"))?;
    let types = file.ints("tokenizer.ggml.token_type")?.unwrap_or_default();
    if !types.is_empty() && types.len() != tokens.len() {
        return Err(GgufError::Malformed {
            path: file.path().to_path_buf(),
            what: "metadata key `tokenizer.ggml.token_type`".into(),
            message: format!("{} entries for {} tokens", types.len(), tokens.len()),
        });
    }
    let config = tokenizer_config(file, &tokens, kind)?;
    if kind == "llama" {
        // transformers builds these architectures' SentencePiece vocabularies differently (a
        // normalizer for Phi-3, respelled space tokens and merges by position for Gemma).
        let arch = file.str("general.architecture")?.unwrap_or_default();
        if matches!(arch, "phi3" | "gemma" | "gemma2" | "gemma3" | "gemma4") {
            return Err(unsupported(
                file,
                "general.architecture",
                &format!("{arch:?} with a SentencePiece vocabulary"),
                "SentencePiece vocabularies of other architectures (llama, mistral, ...)",
            ));
        }
        return Ok((
            sentencepiece_tokenizer(file, &tokens, &types, &config)?,
            config,
        ));
    }
    let merges = file
        .strings("tokenizer.ggml.merges")?
        .ok_or_else(|| file.missing("tokenizer.ggml.merges"))?;
    let alphabet = byte_alphabet();
    let spelled: std::collections::HashSet<char> = alphabet.iter().copied().collect();
    let in_alphabet = |t: &str| t.chars().all(|c| spelled.contains(&c));
    let mut vocab = Map::new();
    for (id, token) in tokens.iter().enumerate() {
        let key = byte_level_spelling(token);
        // A later duplicate replaces an earlier one, as a Python dict does.
        vocab.remove(&key);
        vocab.insert(key, json!(id));
    }
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for (n, merge) in merges.iter().enumerate() {
        let Some((a, b)) = merge.split_once(' ') else {
            return Err(GgufError::Malformed {
                path: file.path().to_path_buf(),
                what: format!("metadata key `tokenizer.ggml.merges`, entry {n}"),
                message: format!("{merge:?} is not two tokens separated by a space"),
            });
        };
        merge_pairs.push(json!([a, b]));
    }
    let mut added = Vec::new();
    for (id, (token, &kind)) in tokens.iter().zip(&types).enumerate() {
        let special = kind == TOKEN_CONTROL && in_alphabet(token);
        if special || kind == TOKEN_USER_DEFINED {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            }));
        }
    }
    let pre = file.str("tokenizer.ggml.pre")?;
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let pre_tokenizer = match pre.and_then(pre_tokenizer_split) {
        Some(split) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]}),
        None => byte_level(true),
    };
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(&config, &|token: &str| {
            vocab.get(token).and_then(Json::as_u64).map(|id| id as usize)
        }),
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merge_pairs,
        },
    });

    Ok((tokenizer, config))
}

/// `tokenizer_config.json` from the metadata: the special tokens by name, the add-BOS/EOS flags
/// (a SentencePiece vocabulary that does not say adds BOS, as llama.cpp and transformers do), the
/// chat template and the `tokenizer.ggml.pre` name.
fn tokenizer_config(
    file: &GgufFile,
    tokens: &[&str],
    kind: &str,
) -> Result<Map<String, Json>, GgufError> {
    let pre = file.str("tokenizer.ggml.pre")?;
    let mut config = Map::new();
    config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    for (name, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        let token = match file.uint(key)? {
            Some(id) => match tokens.get(id as usize) {
                // In a byte-level vocabulary the token is named as the vocabulary spells it (a
                // control token outside the byte alphabet, such as DeepSeek's
                // `<｜begin▁of▁sentence｜>`, is stored respelled, as transformers stores it).
                Some(t) if kind == "gpt2" => json!(byte_level_spelling(t)),
                Some(t) => json!(t),
                None => {
                    return Err(GgufError::Malformed {
                        path: file.path().to_path_buf(),
                        what: format!("metadata key `{key}`"),
                        message: format!(
                            "id {id} is outside the {}-token vocabulary",
                            tokens.len()
                        ),
                    });
                }
            },
            None => Json::Null,
        };
        config.insert(name.into(), token);
    }
    for (name, key) in [
        ("add_bos_token", "tokenizer.ggml.add_bos_token"),
        ("add_eos_token", "tokenizer.ggml.add_eos_token"),
    ] {
        if let Some(flag) = file.bool(key)? {
            config.insert(name.into(), json!(flag));
        }
    }
    if kind == "llama" && !config.contains_key("add_bos_token") {
        config.insert("add_bos_token".into(), json!(true));
    }
    if let Some(template) = file.str("tokenizer.chat_template")? {
        config.insert("chat_template".into(), json!(template));
    }
    if let Some(pre) = pre {
        config.insert(PRE_TOKENIZER_KEY.into(), json!(pre));
    }
    Ok(config)
}

/// transformers' post-processor for a tokenizer built from GGUF: BOS before and EOS after each
/// sequence as `add_bos_token` / `add_eos_token` say (the second sequence of a pair with type id
/// 1), with the ids the vocabulary gives those tokens.
fn post_processor(config: &Map<String, Json>, id_of: &dyn Fn(&str) -> Option<usize>) -> Json {
    let flag = |k: &str| config.get(k).and_then(Json::as_bool).unwrap_or(false);
    let special = |name: &str| -> Option<(String, usize)> {
        let token = config.get(name).and_then(Json::as_str)?;
        id_of(token).map(|id| (token.to_string(), id))
    };
    let mut special_tokens = Map::new();
    let mut template = |type_id: u32, sequence: &str| -> Vec<Json> {
        let mut parts = Vec::new();
        let bos = special("bos_token").filter(|_| flag("add_bos_token"));
        let eos = special("eos_token").filter(|_| flag("add_eos_token"));
        for (token, id) in bos.iter().chain(&eos) {
            special_tokens.insert(
                token.clone(),
                json!({"id": token, "ids": [id], "tokens": [token]}),
            );
        }
        if let Some((token, _)) = &bos {
            parts.push(json!({"SpecialToken": {"id": token, "type_id": type_id}}));
        }
        parts.push(json!({"Sequence": {"id": sequence, "type_id": type_id}}));
        if let Some((token, _)) = &eos {
            parts.push(json!({"SpecialToken": {"id": token, "type_id": type_id}}));
        }
        parts
    };
    let single = template(0, "A");
    let mut pair = template(0, "A");
    pair.extend(template(1, "B"));
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special_tokens})
}

/// llama.cpp token type of the unknown token.
const TOKEN_UNKNOWN: i64 = 2;

/// transformers' `sentencepiece_tokenizer` for a GGUF: `LlamaTokenizer(vocab, merges)` where the
/// merges, when the file has none, are `generate_merges(vocab, scores)`: every split of every token
/// into two tokens of the vocabulary, ordered by the merged token's score (best first), then by the
/// pieces' lengths (longest first), ties in vocabulary order. BPE with byte fallback (`<0xNN>`
/// tokens), a Metaspace pre-tokenizer that puts `▁` before the first piece, and BOS (EOS) added by
/// the post-processor as `add_bos_token` (`add_eos_token`) say.
fn sentencepiece_tokenizer(
    file: &GgufFile,
    tokens: &[&str],
    types: &[i64],
    config: &Map<String, Json>,
) -> Result<Json, GgufError> {
    let scores: Vec<f64> = match file.get("tokenizer.ggml.scores") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_f64().ok_or_else(|| GgufError::KeyType {
                    path: file.path().to_path_buf(),
                    key: "tokenizer.ggml.scores".into(),
                    expected: "an array of numbers".into(),
                    found: v.type_name().into(),
                })
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(file.missing("tokenizer.ggml.scores")),
    };
    if scores.len() != tokens.len() {
        return Err(GgufError::Malformed {
            path: file.path().to_path_buf(),
            what: "metadata key `tokenizer.ggml.scores`".into(),
            message: format!("{} scores for {} tokens", scores.len(), tokens.len()),
        });
    }
    // Python dicts: a repeated token keeps its first position, and its last id and score.
    let mut vocab: HashMap<&str, usize> = HashMap::new();
    let mut score_of: HashMap<&str, f64> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    for (id, (&token, &score)) in tokens.iter().zip(&scores).enumerate() {
        if vocab.insert(token, id).is_none() {
            order.push(token);
        }
        score_of.insert(token, score);
    }
    let merges: Vec<Json> = match file.strings("tokenizer.ggml.merges")? {
        Some(list) => list
            .iter()
            .map(|m| match m.split_once(' ') {
                Some((a, b)) => Ok(json!([a, b])),
                None => Err(GgufError::Malformed {
                    path: file.path().to_path_buf(),
                    what: "metadata key `tokenizer.ggml.merges`".into(),
                    message: format!("{m:?} is not two tokens separated by a space"),
                }),
            })
            .collect::<Result<_, _>>()?,
        None => {
            let mut merges: Vec<(&str, &str, f64)> = Vec::new();
            for &merged in &order {
                let mut local: Vec<(&str, &str, f64)> = merged
                    .char_indices()
                    .skip(1)
                    .map(|(at, _)| (&merged[..at], &merged[at..]))
                    .filter(|(l, r)| vocab.contains_key(l) && vocab.contains_key(r))
                    .map(|(l, r)| (l, r, score_of[merged]))
                    .collect();
                local.sort_by_key(|(l, r, _)| (vocab[l], vocab[r]));
                merges.extend(local);
            }
            // Python's sorted(..., reverse=True) is stable: equal keys keep their order, as here.
            merges.sort_by(|a, b| {
                b.2.total_cmp(&a.2)
                    .then(b.0.chars().count().cmp(&a.0.chars().count()))
                    .then(b.1.chars().count().cmp(&a.1.chars().count()))
            });
            merges.into_iter().map(|(l, r, _)| json!([l, r])).collect()
        }
    };
    let vocab_json: Map<String, Json> = vocab
        .iter()
        .map(|(t, &id)| ((*t).to_string(), json!(id)))
        .collect();
    // The class's own special tokens (unk, bos, eos, pad) and the file's control tokens are
    // special added tokens; user-defined ones are plain added tokens.
    let named: Vec<&str> = ["unk_token", "bos_token", "eos_token", "pad_token"]
        .iter()
        .filter_map(|k| config.get(*k).and_then(Json::as_str))
        .collect();
    let mut added = Vec::new();
    for (id, &token) in tokens.iter().enumerate() {
        let kind = types.get(id).copied().unwrap_or(1);
        let special = kind == TOKEN_CONTROL || kind == TOKEN_UNKNOWN || named.contains(&token);
        if (special || kind == TOKEN_USER_DEFINED) && vocab.get(token) == Some(&id) {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            }));
        }
    }
    let post_processor = post_processor(config, &|token: &str| vocab.get(token).copied());
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": false},
        "post_processor": post_processor,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab_json, "merges": merges,
        },
    }))
}

/// The GGUF metadata for a model in the Hugging Face layout: `config` (config.json),
/// `tokenizer` (tokenizer.json), `tokenizer_config` (tokenizer_config.json, may be empty),
/// `name` (general.name), `file_type` (general.file_type).
pub fn gguf_metadata(
    config: &Json,
    tokenizer: &Json,
    tokenizer_config: &Json,
    name: &str,
    file_type: u32,
) -> Result<Vec<(String, Value)>, String> {
    let arch = config
        .get("model_type")
        .and_then(Json::as_str)
        .and_then(gguf_architecture)
        .ok_or(
            "config.json: model_type must be llama, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, \
             olmoe or deepseek_v3 for a GGUF export",
        )?;
    let uint = |k: &str| -> Result<u64, String> {
        config
            .get(k)
            .and_then(Json::as_u64)
            .ok_or_else(|| format!("config.json: `{k}` is missing or not an integer"))
    };
    let hidden = uint("hidden_size")?;
    let heads = uint("num_attention_heads")?;
    let kv_heads = config
        .get("num_key_value_heads")
        .and_then(Json::as_u64)
        .unwrap_or(heads);
    let head_dim = config
        .get("head_dim")
        .and_then(Json::as_u64)
        .unwrap_or(hidden / heads.max(1));
    let theta = config
        .get("rope_theta")
        .and_then(Json::as_f64)
        .or_else(|| {
            config
                .pointer("/rope_parameters/rope_theta")
                .and_then(Json::as_f64)
        })
        .unwrap_or(10_000.0);
    let rope_type = config
        .pointer("/rope_scaling/rope_type")
        .or_else(|| config.pointer("/rope_parameters/rope_type"))
        .and_then(Json::as_str)
        .unwrap_or("default");
    // llama3 scaling travels as the `rope_freqs.weight` tensor, which the caller writes.
    // deepseek2 has its own YaRN keys (see `deepseek2_metadata`).
    if rope_type != "default"
        && rope_type != "llama3"
        && !(arch == DEEPSEEK2 && rope_type == "yarn")
    {
        return Err(format!(
            "config.json: rope type {rope_type:?} is not exported to GGUF yet (default and llama3 \
             are, and yarn for deepseek_v3)"
        ));
    }
    let k = |s: &str| format!("{arch}.{s}");
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.type".into(), Value::String("model".into())),
        ("general.name".into(), Value::String(name.into())),
        ("general.file_type".into(), Value::U32(file_type)),
        ("general.quantization_version".into(), Value::U32(2)),
        (
            k("block_count"),
            Value::U32(uint("num_hidden_layers")? as u32),
        ),
        (
            k("context_length"),
            Value::U32(
                config
                    .get("max_position_embeddings")
                    .and_then(Json::as_u64)
                    .unwrap_or(2048) as u32,
            ),
        ),
        (k("embedding_length"), Value::U32(hidden as u32)),
        (
            k("feed_forward_length"),
            Value::U32(uint("intermediate_size")? as u32),
        ),
        (k("attention.head_count"), Value::U32(heads as u32)),
        (k("attention.head_count_kv"), Value::U32(kv_heads as u32)),
        (k("rope.freq_base"), Value::F32(theta as f32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(
                config
                    .get("rms_norm_eps")
                    .and_then(Json::as_f64)
                    .unwrap_or(1e-6) as f32,
            ),
        ),
        (k("attention.key_length"), Value::U32(head_dim as u32)),
        (k("attention.value_length"), Value::U32(head_dim as u32)),
        (k("rope.dimension_count"), Value::U32(head_dim as u32)),
        (k("vocab_size"), Value::U32(uint("vocab_size")? as u32)),
    ];
    let experts = config
        .get("num_experts")
        .or_else(|| config.get("num_local_experts"))
        .and_then(Json::as_u64);
    if let Some(experts) = experts {
        meta.push((k("expert_count"), Value::U32(experts as u32)));
        meta.push((
            k("expert_used_count"),
            Value::U32(uint("num_experts_per_tok")? as u32),
        ));
        if arch == "qwen2moe" || arch == "qwen3moe" {
            meta.push((
                k("expert_feed_forward_length"),
                Value::U32(uint("moe_intermediate_size")? as u32),
            ));
        }
        if arch == "qwen2moe" {
            meta.push((
                k("expert_shared_feed_forward_length"),
                Value::U32(uint("shared_expert_intermediate_size")? as u32),
            ));
        }
    }
    if let Some(clamp) = config.get("clip_qkv").and_then(Json::as_f64) {
        meta.push((k("attention.clamp_kqv"), Value::F32(clamp as f32)));
    }
    if arch == DEEPSEEK2 {
        deepseek2_metadata(config, &mut meta)?;
    }
    meta.extend(tokenizer_metadata(tokenizer, tokenizer_config, config)?);
    Ok(meta)
}

/// The `deepseek2.*` keys llama.cpp's converter writes for a DeepSeek-V3 config, replacing the
/// generic attention sizes in `meta` with its MQA view of MLA (see [`DEEPSEEK2`]).
fn deepseek2_metadata(config: &Json, meta: &mut Vec<(String, Value)>) -> Result<(), String> {
    let k = |s: &str| format!("{DEEPSEEK2}.{s}");
    let uint = |key: &str| -> Result<u32, String> {
        config
            .get(key)
            .and_then(Json::as_u64)
            .map(|v| v as u32)
            .ok_or_else(|| format!("config.json: `{key}` is missing or not an integer"))
    };
    let float = |key: &str, default: f64| config.get(key).and_then(Json::as_f64).unwrap_or(default);
    let rope = uint("qk_rope_head_dim")?;
    let rank = uint("kv_lora_rank")?;
    let mut set = |key: String, value: Value| match meta.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => meta.push((key, value)),
    };
    set(k("attention.head_count_kv"), Value::U32(1));
    set(k("attention.key_length"), Value::U32(rank + rope));
    set(k("attention.value_length"), Value::U32(rank));
    set(
        k("attention.key_length_mla"),
        Value::U32(uint("qk_nope_head_dim")? + rope),
    );
    set(
        k("attention.value_length_mla"),
        Value::U32(uint("v_head_dim")?),
    );
    set(k("rope.dimension_count"), Value::U32(rope));
    set(k("attention.kv_lora_rank"), Value::U32(rank));
    if let Some(q_rank) = config.get("q_lora_rank").and_then(Json::as_u64) {
        set(k("attention.q_lora_rank"), Value::U32(q_rank as u32));
    }
    set(
        k("leading_dense_block_count"),
        Value::U32(
            config
                .get("first_k_dense_replace")
                .and_then(Json::as_u64)
                .unwrap_or(0) as u32,
        ),
    );
    set(k("expert_count"), Value::U32(uint("n_routed_experts")?));
    set(
        k("expert_used_count"),
        Value::U32(uint("num_experts_per_tok")?),
    );
    set(
        k("expert_feed_forward_length"),
        Value::U32(uint("moe_intermediate_size")?),
    );
    set(
        k("expert_shared_count"),
        Value::U32(
            config
                .get("n_shared_experts")
                .and_then(Json::as_u64)
                .unwrap_or(0) as u32,
        ),
    );
    set(
        k("expert_weights_scale"),
        Value::F32(float("routed_scaling_factor", 1.0) as f32),
    );
    set(
        k("expert_weights_norm"),
        Value::Bool(
            config
                .get("norm_topk_prob")
                .and_then(Json::as_bool)
                .unwrap_or(false),
        ),
    );
    // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID.
    set(k("expert_gating_func"), Value::U32(2));
    set(
        k("expert_group_count"),
        Value::U32(config.get("n_group").and_then(Json::as_u64).unwrap_or(1) as u32),
    );
    set(
        k("expert_group_used_count"),
        Value::U32(config.get("topk_group").and_then(Json::as_u64).unwrap_or(1) as u32),
    );
    let scaling = config
        .get("rope_scaling")
        .filter(|s| s.is_object())
        .or_else(|| config.get("rope_parameters"));
    let field = |name: &str| scaling.and_then(|s| s.get(name)).and_then(Json::as_f64);
    let yarn = scaling
        .and_then(|s| s.get("rope_type").or_else(|| s.get("type")))
        .and_then(Json::as_str)
        == Some("yarn");
    if yarn {
        // llama.cpp keeps the rotation's own YaRN factor at 1 and scales the scores by
        // (1 + 0.1 · mscale_all_dim · ln factor)²: transformers' numbers only when mscale equals
        // mscale_all_dim (DeepSeek-V3's 1.0 and 1.0) and no attention_factor overrides them.
        let (mscale, all_dim) = (field("mscale"), field("mscale_all_dim"));
        if mscale.is_none()
            || mscale != all_dim
            || mscale == Some(0.0)
            || field("attention_factor").is_some_and(|a| a != 1.0)
        {
            return Err(format!(
                "config.json: YaRN with mscale {mscale:?} and mscale_all_dim {all_dim:?} has no \
                 deepseek2 GGUF form (llama.cpp assumes the two are equal)"
            ));
        }
        for (name, default) in [("beta_fast", 32.0), ("beta_slow", 1.0)] {
            if field(name).is_some_and(|v| v != default) {
                return Err(format!(
                    "config.json: YaRN's {name} {:?} is not llama.cpp's {default} for deepseek2",
                    field(name)
                ));
            }
        }
        let factor = field("factor")
            .ok_or("config.json: YaRN without a `factor` has no deepseek2 GGUF form")?;
        let original = scaling
            .and_then(|s| s.get("original_max_position_embeddings"))
            .and_then(Json::as_u64)
            .ok_or("config.json: YaRN without `original_max_position_embeddings`")?;
        set(k("rope.scaling.type"), Value::String("yarn".into()));
        set(k("rope.scaling.factor"), Value::F32(factor as f32));
        set(
            k("rope.scaling.original_context_length"),
            Value::U32(original as u32),
        );
        set(
            k("rope.scaling.yarn_log_multiplier"),
            Value::F32(0.1 * mscale.unwrap_or(0.0) as f32),
        );
    }
    Ok(())
}

/// llama.cpp's architecture for a transformers `model_type` stoke exports (Mixtral is its
/// `llama` with experts).
pub fn gguf_architecture(model_type: &str) -> Option<&'static str> {
    Some(match model_type {
        "llama" | "mixtral" => "llama",
        "qwen2" => "qwen2",
        "qwen3" => "qwen3",
        "qwen2_moe" => "qwen2moe",
        "qwen3_moe" => "qwen3moe",
        "olmoe" => "olmoe",
        "deepseek_v3" => DEEPSEEK2,
        _ => return None,
    })
}

/// The `tokenizer.*` keys for a byte-level BPE `tokenizer.json`, with its `tokenizer_config.json`
/// (special tokens, chat template) and the model's `config.json` (vocabulary size, and the
/// special token ids where the tokenizer config names none).
pub fn tokenizer_metadata(
    tokenizer: &Json,
    tokenizer_config: &Json,
    config: &Json,
) -> Result<Vec<(String, Value)>, String> {
    let model = tokenizer.get("model").ok_or("tokenizer.json: no `model`")?;
    if model.get("type").and_then(Json::as_str) != Some("BPE") {
        return Err("tokenizer.json: only byte-level BPE tokenizers are exported to GGUF".into());
    }
    let vocab = model
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or("tokenizer.json: `model.vocab` is not an object")?;
    let mut by_id: BTreeMap<u64, (String, i64)> = BTreeMap::new();
    for (token, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| format!("tokenizer.json: id of {token:?} is not an integer"))?;
        by_id.insert(id, (token.clone(), 1));
    }
    let added = tokenizer
        .get("added_tokens")
        .and_then(Json::as_array)
        .cloned()
        .unwrap_or_default();
    for entry in &added {
        let (Some(id), Some(content)) = (
            entry.get("id").and_then(Json::as_u64),
            entry.get("content").and_then(Json::as_str),
        ) else {
            return Err("tokenizer.json: an `added_tokens` entry lacks id or content".into());
        };
        let special = entry
            .get("special")
            .and_then(Json::as_bool)
            .unwrap_or(false);
        let kind = if special {
            TOKEN_CONTROL
        } else {
            TOKEN_USER_DEFINED
        };
        by_id.insert(id, (content.to_string(), kind));
    }
    let size = config
        .get("vocab_size")
        .and_then(Json::as_u64)
        .unwrap_or(0)
        .max(by_id.keys().next_back().map_or(0, |&m| m + 1));
    let mut tokens = Vec::with_capacity(size as usize);
    let mut types = Vec::with_capacity(size as usize);
    for id in 0..size {
        match by_id.get(&id) {
            Some((token, kind)) => {
                tokens.push(Value::String(token.clone()));
                types.push(Value::I32(*kind as i32));
            }
            // Rows of the embedding no token uses (vocabularies padded to a multiple of 64),
            // named as llama.cpp's converter names them.
            None => {
                tokens.push(Value::String(format!("[PAD{id}]")));
                types.push(Value::I32(5));
            }
        }
    }
    let merges: Vec<Value> = model
        .get("merges")
        .and_then(Json::as_array)
        .ok_or("tokenizer.json: `model.merges` is not a list")?
        .iter()
        .map(|m| match m {
            Json::String(s) => Ok(Value::String(s.clone())),
            Json::Array(pair) => match pair.as_slice() {
                [Json::String(a), Json::String(b)] => Ok(Value::String(format!("{a} {b}"))),
                _ => Err("tokenizer.json: a merge is not a pair of strings".to_string()),
            },
            _ => Err("tokenizer.json: a merge is not a string or pair".to_string()),
        })
        .collect::<Result<_, _>>()?;
    let pre = match tokenizer_config
        .get(PRE_TOKENIZER_KEY)
        .and_then(Json::as_str)
    {
        Some(pre) => pre.to_string(),
        None => detect_pre_tokenizer(tokenizer)?,
    };
    let mut meta: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre)),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
    ];
    let id_of = |token: &str| -> Option<u64> {
        by_id
            .iter()
            .find(|(_, (t, _))| t == token)
            .map(|(&id, _)| id)
    };
    let token_field = |name: &str| -> Option<String> {
        match tokenizer_config.get(name)? {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content").and_then(Json::as_str).map(String::from),
            _ => None,
        }
    };
    for (name, key, fallback) in [
        ("bos_token", "tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id", ""),
        (
            "pad_token",
            "tokenizer.ggml.padding_token_id",
            "pad_token_id",
        ),
    ] {
        let id = token_field(name)
            .and_then(|t| id_of(&t))
            .or_else(|| match config.get(fallback) {
                Some(Json::Array(ids)) => ids.first().and_then(Json::as_u64),
                Some(v) => v.as_u64(),
                None => None,
            });
        if let Some(id) = id {
            meta.push((key.into(), Value::U32(id as u32)));
        }
    }
    if let Some(flag) = tokenizer_config
        .get("add_bos_token")
        .and_then(Json::as_bool)
    {
        meta.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(flag)));
    }
    if let Some(template) = tokenizer_config.get("chat_template").and_then(Json::as_str) {
        meta.push((
            "tokenizer.chat_template".into(),
            Value::String(template.into()),
        ));
    }
    Ok(meta)
}

/// The `tokenizer.ggml.pre` that names a `tokenizer.json`'s pre-tokenizer, for the shapes stoke
/// recognizes: GPT-2's byte-level regex alone, that regex after single digits (SmolLM), and the
/// split regexes of the table above.
fn detect_pre_tokenizer(tokenizer: &Json) -> Result<String, String> {
    let pre = tokenizer.get("pre_tokenizer").unwrap_or(&Json::Null);
    let kind = |v: &Json| v.get("type").and_then(Json::as_str).map(String::from);
    let byte_level_regex = |v: &Json| {
        kind(v).as_deref() == Some("ByteLevel") && v.get("use_regex") != Some(&json!(false))
    };
    if byte_level_regex(pre) {
        return Ok("gpt-2".into());
    }
    if kind(pre).as_deref() == Some("Sequence") {
        let parts = pre
            .get("pretokenizers")
            .and_then(Json::as_array)
            .cloned()
            .unwrap_or_default();
        if let [digits, byte_level] = parts.as_slice() {
            if kind(digits).as_deref() == Some("Digits")
                && digits.get("individual_digits") == Some(&json!(true))
                && byte_level_regex(byte_level)
            {
                return Ok("smollm".into());
            }
            let regex = digits.pointer("/pattern/Regex").and_then(Json::as_str);
            if kind(digits).as_deref() == Some("Split")
                && kind(byte_level).as_deref() == Some("ByteLevel")
            {
                for (name, split) in [
                    ("llama-bpe", LLAMA3_SPLIT),
                    // GPT-4's cl100k split (stoke's own tokenizer trainer uses it) is Llama 3's
                    // with possessive quantifiers and `\s*[\r\n]` for `\s*[\r\n]+`: the same
                    // pieces, since the possessive parts cannot give back anything the rest
                    // could match and a run of newlines is taken whole by both.
                    ("llama-bpe", CL100K_SPLIT),
                    ("qwen2", QWEN2_SPLIT),
                    ("qwen35", QWEN35_SPLIT),
                    ("tekken", TEKKEN_SPLIT),
                    ("gpt-4o", GPT4O_SPLIT),
                ] {
                    if regex == Some(split) {
                        return Ok(name.into());
                    }
                }
            }
        }
    }
    Err(format!(
        "tokenizer.json: its pre-tokenizer ({}) is not one llama.cpp names (GPT-2 byte-level, \
         SmolLM digits + byte-level, or the Llama 3 / Qwen2 / GPT-4o splits), so a GGUF could \
         not tokenize like it",
        serde_json::to_string(pre).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_names_map_both_ways() {
        for (gguf, hf) in [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output.weight", "lm_head.weight"),
            ("output_norm.weight", "model.norm.weight"),
            (
                "blk.12.attn_q.bias",
                "model.layers.12.self_attn.q_proj.bias",
            ),
            (
                "blk.0.ffn_down.weight",
                "model.layers.0.mlp.down_proj.weight",
            ),
            (
                "blk.3.attn_k_norm.weight",
                "model.layers.3.self_attn.k_norm.weight",
            ),
        ] {
            assert_eq!(hf_tensor_name("qwen3", gguf).as_deref(), Some(hf));
            assert_eq!(gguf_tensor_name("qwen3", hf).as_deref(), Some(gguf));
        }
        assert_eq!(hf_tensor_name("llama", "rope_freqs.weight"), None);
        assert_eq!(hf_tensor_name("llama", "blk.x.attn_q.weight"), None);
        assert_eq!(
            hf_tensor_name("qwen3moe", "blk.0.ffn_gate_exps.weight"),
            None
        );
        // DeepSeek-V3's latent attention, shared experts and selection bias.
        for (gguf, hf) in [
            (
                "blk.2.attn_kv_a_mqa.weight",
                "model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
            ),
            (
                "blk.0.attn_q_a_norm.weight",
                "model.layers.0.self_attn.q_a_layernorm.weight",
            ),
            (
                "blk.1.ffn_up_shexp.weight",
                "model.layers.1.mlp.shared_experts.up_proj.weight",
            ),
            (
                "blk.1.exp_probs_b.bias",
                "model.layers.1.mlp.gate.e_score_correction_bias",
            ),
        ] {
            assert_eq!(hf_tensor_name(DEEPSEEK2, gguf).as_deref(), Some(hf));
            assert_eq!(gguf_tensor_name(DEEPSEEK2, hf).as_deref(), Some(gguf));
        }
        // Qwen2-MoE's shared expert is singular.
        assert_eq!(
            hf_tensor_name("qwen2moe", "blk.1.ffn_up_shexp.weight").as_deref(),
            Some("model.layers.1.mlp.shared_expert.up_proj.weight")
        );
    }

    #[test]
    fn kv_b_splits_into_llama_cpp_halves_and_joins_back() {
        // 2 heads, nope 2, value 3, rank 4: kv_b is [2 * 5, 4]; each value is 100 h + 10 row + col.
        let shape = KvB {
            heads: 2,
            nope: 2,
            value: 3,
            rank: 4,
        };
        let kv_b: Vec<f32> = (0..2)
            .flat_map(|h| {
                (0..5).flat_map(move |r| (0..4).map(move |c| (100 * h + 10 * r + c) as f32))
            })
            .collect();
        let (k_b, v_b) = shape.split(&kv_b).unwrap();
        // k_b[h, r, n] = kv_b[h, n, r].
        assert_eq!(k_b[(4 + 3) * 2 + 1], 100.0 + 10.0 + 3.0);
        // v_b[h, v, r] = kv_b[h, nope + v, r].
        assert_eq!(v_b[(3 + 2) * 4 + 1], 100.0 + 40.0 + 1.0);
        assert_eq!(shape.join(&k_b, &v_b).unwrap(), kv_b);
        assert!(shape.split(&kv_b[1..]).is_err());
        assert!(shape.join(&k_b, &v_b[1..]).is_err());
    }

    #[test]
    fn rotary_rows_permute_only_the_rope_part_of_each_block() {
        // 2 blocks of 5 rows: 1 plain row, then 4 rotary rows; each row holds its index.
        let values: Vec<f32> = (0..10).map(|r| r as f32).collect();
        let gguf = permute_rotary_rows(&values, 10, 5, 1, 4, true).unwrap();
        assert_eq!(gguf, [0., 1., 3., 2., 4., 5., 6., 8., 7., 9.]);
        assert_eq!(
            permute_rotary_rows(&gguf, 10, 5, 1, 4, false).unwrap(),
            values
        );
        assert!(permute_rotary_rows(&values, 10, 5, 2, 4, true).is_err());
        assert!(permute_rotary_rows(&values, 10, 4, 0, 4, true).is_err());
    }

    #[test]
    fn permutation_round_trips_and_pairs_rows() {
        // 2 heads of 4 rows (2 pairs each), 3 columns; each row holds its own index.
        let values: Vec<f32> = (0..8).flat_map(|r| [r as f32; 3]).collect();
        let to_gguf = permute_rows(&values, 8, 2, true).unwrap();
        let rows: Vec<f32> = to_gguf.chunks(3).map(|r| r[0]).collect();
        // llama.cpp interleaves the two halves of each head: 0 2 1 3 | 4 6 5 7.
        assert_eq!(rows, [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        assert_eq!(permute_rows(&to_gguf, 8, 2, false).unwrap(), values);
        assert!(permute_rows(&values, 8, 3, true).is_err());
    }

    #[test]
    fn byte_alphabet_matches_gpt2() {
        let a = byte_alphabet();
        assert_eq!(a[b'!' as usize], '!');
        assert_eq!(a[b' ' as usize], 'Ġ');
        assert_eq!(a[b'\n' as usize], 'Ċ');
        assert_eq!(a[0], 'Ā');
        let distinct: std::collections::HashSet<char> = a.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }
}
