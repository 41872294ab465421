//! `config.json` between GGUF and the Hugging Face layout: which architectures stoke loads
//! (`general.architecture` and its transformers class), transformers' `config.json` from the
//! `{arch}.*` keys ([`hf_config`], including DeepSeek-V3's MLA sizes and the rope scaling keys),
//! and back, the `general.*` and `{arch}.*` keys llama.cpp reads for a `config.json`
//! ([`gguf_metadata`], which appends the tokenizer's keys so an export writes one list).
//!
//! Not here: tensor names and the q/k permutation (`names`), the `tokenizer.*` keys
//! (`tokenizer`), and the rope scaling that llama.cpp stores as the [`ROPE_FREQS`] tensor, which
//! the model crate recovers from its values.
//!
//! Invariants: reading checks the architecture first and refuses one stoke does not load with
//! [`GgufError::Unsupported`] naming the key; a missing required key is an error naming it, and
//! an optional one takes transformers' default. Writing refuses a `config.json` it cannot
//! express (a missing field, an unexported rope type) with a message naming the field, rather
//! than writing a file llama.cpp would read differently.

use serde_json::{Map, Value as Json, json};

use super::tokenizer::tokenizer_metadata;
use crate::error::GgufError;
use crate::read::{GgufFile, Value, unsupported};

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
/// [`MLA_K_B`](super::MLA_K_B) and [`MLA_V_B`](super::MLA_V_B) for the absorbed decode, and leaves out the multi-token
/// prediction layers. Its RoPE pairs adjacent values, which is transformers'
/// `rope_interleave = true`.
pub const DEEPSEEK2: &str = "deepseek2";

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
