//! Tensor names between GGUF and the Hugging Face layout (`blk.N.attn_q.weight` <->
//! `model.layers.N.self_attn.q_proj.weight`), and the reorderings a tensor's values need on the
//! way: the inverse of llama.cpp's q/k row permutation for llama (its RoPE pairs adjacent values
//! where transformers pairs the two halves of a head), the same for the rotary rows of
//! DeepSeek's MLA, the split of MLA's `kv_b_proj` into llama.cpp's `attn_k_b` / `attn_v_b`, and
//! the names of llama.cpp's stacked expert tensors.
//!
//! Not here: reading or writing tensor data (the model crate's loader and exporter call these
//! functions on the values they hold), splitting stacked experts per expert (the model loader),
//! and the config and tokenizer metadata (`config`, `tokenizer`). Nothing here opens a file.
//!
//! Invariants: [`hf_tensor_name`] and [`gguf_tensor_name`] are inverses on the names they map,
//! and a name they do not map gives `None`, never a guess; [`permute_rows`] and
//! [`permute_rotary_rows`] with `to_gguf` true and false are inverses, and [`KvB::join`] inverts
//! [`KvB::split`]; a shape that does not divide gives an error, never a partial reorder.

use serde_json::Value as Json;

use super::config::DEEPSEEK2;

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
}
