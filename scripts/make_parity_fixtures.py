#!/usr/bin/env python3
"""Golden fixtures from the reference implementation (Hugging Face transformers).

What it is: a hand-run generator of the files under fixtures/ that stoke's Rust parity tests
compare against: tiny random-weight checkpoints with reference logits, loss and gradients
(fixtures/models/), tiny byte-level BPE tokenizers carrying the real special tokens and chat
templates of Qwen2.5-Instruct and Llama-3.2-Instruct (fixtures/tokenizers/), and the chat
renderings transformers produces with them (fixtures/chat/).

What it is not: part of CI. CI never runs Python ML packages; the outputs are committed.

Invariants:
- Everything is seeded; rerunning with the pinned versions (scripts/requirements-fixtures.txt)
  reproduces the same files.
- Every reference is computed from the checkpoint as RELOADED from disk with
  `AutoModelForCausalLM.from_pretrained(..., dtype=float32, attn_implementation="eager")`, so a
  bf16 checkpoint's reference is that of its bf16-rounded weights computed in float32.

Usage:
    $VENV/bin/python scripts/make_parity_fixtures.py            # (re)build all fixtures
    $VENV/bin/python scripts/make_parity_fixtures.py --check-saved SRC_DIR SAVED_DIR
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
SCRIPT_DIR = Path(__file__).resolve().parent

# Reference sequence lengths: row a is the long one, row b the short one (right-padded in the batch).
LEN_A = 12
LEN_B = 8
PAD_ID = 0
# Tolerance of --check-saved (max abs logit difference).
CHECK_SAVED_TOL = 1e-5

# ----------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------

# Pre-tokenizer split patterns, as in the real tokenizer.json files. Qwen2 splits digits one by
# one (\p{N}); Llama 3 keeps runs of up to three digits (\p{N}{1,3}).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
# 256 byte tokens + this many merges, then the special tokens at the end (as in the real files,
# where the special tokens come after the ordinary vocabulary).
NUM_MERGES = 36

TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs on.
You are a helpful assistant. The user asks a question and the assistant answers it.
What is the capital of France? The capital of France is Paris.
How many legs does a spider have? A spider has 8 legs, and an insect has 6.
Write a function that returns the sum of two numbers: def add(a, b): return a + b
Please think step by step, then give the final answer in one line.
In 2024 there were 366 days; in 2023 there were 365 days.
Thank you! You're welcome. I'm here to help, and we'll get there.
Café, naïve, über, smörgåsbord: words with accents are still words.
中文文本也可以出现在这里。こんにちは、世界。
Numbers like 3.14159 and 2.71828 appear in the text, as do 1000 and 42.
The assistant should answer the question the user asked, and then stop.
"""

TOKENIZER_TEST_STRINGS = [
    "Hello world",
    "The capital of France is Paris.",
    "  leading spaces and trailing  ",
    "Numbers: 1234567 and 3.14159",
    "Line one\nLine two\n\n\tTabbed",
    "Café naïve über 中文 こんにちは 🦀",
    "don't won't I'm we'll THEY'RE",
    "<|im_start|>user\nhi<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
]


def tiny_bpe(split_pattern: str, specials: list[str], qwen_style: bool) -> Tokenizer:
    """Trains a byte-level BPE with NUM_MERGES merges; the pipeline mirrors the real family."""
    tok = Tokenizer(models.BPE(ignore_merges=not qwen_style, fuse_unk=False, byte_fallback=False))
    if qwen_style:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split_pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split_pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + NUM_MERGES,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=alphabet,
        special_tokens=[],
    )
    tok.train_from_iterator(TRAINING_TEXT.splitlines(keepends=True) * 4, trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if qwen_style:
        tok.post_processor = processors.ByteLevel(
            add_prefix_space=False, trim_offsets=False, use_regex=False
        )
    else:
        bos = "<|begin_of_text|>"
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
                processors.TemplateProcessing(
                    single=f"{bos}:0 $A:0",
                    pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                    special_tokens=[(bos, bos_id)],
                ),
            ]
        )
    return tok


def added_tokens_decoder(tok: Tokenizer, specials: list[str]) -> dict:
    return {
        str(tok.token_to_id(s)): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for s in specials
    }


@dataclass
class TokenizerSpec:
    name: str
    family: str
    template_file: str  # under scripts/chat_templates/
    generation_template_file: str
    specials: list[str]
    qwen_style: bool
    config_extra: dict = field(default_factory=dict)


TOKENIZER_SPECS = [
    TokenizerSpec(
        name="qwen2",
        family="Qwen2.5-Instruct",
        template_file="qwen2.5-instruct.jinja",
        generation_template_file="qwen2.5-instruct.generation.jinja",
        specials=QWEN2_SPECIALS,
        qwen_style=True,
        # Fields as in Qwen/Qwen2.5-*-Instruct tokenizer_config.json.
        config_extra={
            "add_bos_token": False,
            "add_prefix_space": False,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": 131072,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        },
    ),
    TokenizerSpec(
        name="llama3",
        family="Llama-3.2-Instruct",
        template_file="llama-3.2-instruct.jinja",
        generation_template_file="llama-3.2-instruct.generation.jinja",
        specials=LLAMA3_SPECIALS,
        qwen_style=False,
        # Fields as in meta-llama/Llama-3.2-*-Instruct tokenizer_config.json (no pad token there).
        config_extra={
            "bos_token": "<|begin_of_text|>",
            "clean_up_tokenization_spaces": True,
            "eos_token": "<|eot_id|>",
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    ),
]


def build_tokenizer(spec: TokenizerSpec) -> Path:
    out = FIXTURES / "tokenizers" / spec.name
    out.mkdir(parents=True, exist_ok=True)
    split = QWEN2_SPLIT if spec.qwen_style else LLAMA3_SPLIT
    tok = tiny_bpe(split, spec.specials, spec.qwen_style)
    tok.save(str(out / "tokenizer.json"))
    template = (SCRIPT_DIR / "chat_templates" / spec.template_file).read_text()
    generation_template = (SCRIPT_DIR / "chat_templates" / spec.generation_template_file).read_text()
    config = {"added_tokens_decoder": added_tokens_decoder(tok, spec.specials)}
    config.update(spec.config_extra)
    config["chat_template"] = template
    config = dict(sorted(config.items()))
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template_generation.jinja").write_text(generation_template)

    # The tokenizer as transformers loads it must encode exactly like the raw tokenizer.json.
    hf = AutoTokenizer.from_pretrained(str(out))
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    cases = []
    for text in TOKENIZER_TEST_STRINGS:
        ids_hf = hf(text)["input_ids"]
        ids_raw = raw.encode(text).ids
        assert ids_hf == ids_raw, (spec.name, text, ids_hf, ids_raw)
        ids_plain = hf(text, add_special_tokens=False)["input_ids"]
        cases.append(
            {
                "text": text,
                "ids_add_special_tokens": ids_hf,
                "ids_no_special_tokens": ids_plain,
                "decoded": hf.decode(ids_hf),
                "decoded_skip_special_tokens": hf.decode(ids_hf, skip_special_tokens=True),
            }
        )
    reference = {
        "tokenizer": spec.name,
        "family": spec.family,
        "transformers_version": transformers.__version__,
        "vocab_size_with_specials": raw.get_vocab_size(with_added_tokens=True),
        "special_token_ids": {s: raw.token_to_id(s) for s in spec.specials},
        "bos_token": config.get("bos_token"),
        "eos_token": config.get("eos_token"),
        "pad_token": config.get("pad_token"),
        "tokenizer_class": type(hf).__name__,
        "cases": cases,
    }
    (out / "reference.json").write_text(json.dumps(reference, indent=2, ensure_ascii=False) + "\n")
    print(f"tokenizer {spec.name}: {reference['vocab_size_with_specials']} tokens -> {out}")
    return out


# ----------------------------------------------------------------------------------------------
# Chat references
# ----------------------------------------------------------------------------------------------

LLAMA_DATE = "26 Jul 2024"

CHAT_CASES = [
    {
        "name": "system_user_gen",
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2 + 2?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "user_only_gen",
        "messages": [{"role": "user", "content": "Hello there!"}],
        "add_generation_prompt": True,
    },
    {
        "name": "user_only_no_gen",
        "messages": [{"role": "user", "content": "Hello there!"}],
        "add_generation_prompt": False,
    },
    {
        "name": "multi_turn_no_gen",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name a prime number."},
            {"role": "assistant", "content": "7 is a prime number."},
            {"role": "user", "content": "And an even one?"},
            {"role": "assistant", "content": "2 is the only even prime."},
        ],
        "add_generation_prompt": False,
    },
    {
        "name": "multi_turn_gen",
        "messages": [
            {"role": "user", "content": "Name a prime number."},
            {"role": "assistant", "content": "7 is a prime number."},
            {"role": "user", "content": "And an even one?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "non_ascii_newlines",
        "messages": [
            {"role": "system", "content": "  Réponds en français.\n"},
            {"role": "user", "content": "Café ☕ et 中文?\nDeux lignes.\n\n  Indentée."},
            {"role": "assistant", "content": " Oui: naïve, über, 🦀.\nFin. "},
        ],
        "add_generation_prompt": False,
    },
]


def build_chat_reference(tokenizer_dirs: dict[str, Path]) -> None:
    out = FIXTURES / "chat"
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "transformers_version": transformers.__version__,
        "note": "text/input_ids: tokenizer.apply_chat_template with the tokenizer's own chat_template; "
        "assistant_masks: the same conversation rendered with chat_template_generation.jinja and "
        "return_assistant_tokens_mask=True (see fixtures/README.md).",
        "tokenizers": {},
    }
    for spec in TOKENIZER_SPECS:
        tdir = tokenizer_dirs[spec.name]
        tok = AutoTokenizer.from_pretrained(str(tdir))
        generation_template = (tdir / "chat_template_generation.jinja").read_text()
        cases = []
        for case in CHAT_CASES:
            kwargs = {}
            if spec.name == "llama3":
                kwargs["date_string"] = LLAMA_DATE
            agp = case["add_generation_prompt"]
            text = tok.apply_chat_template(
                case["messages"], tokenize=False, add_generation_prompt=agp, **kwargs
            )
            enc = tok.apply_chat_template(
                case["messages"], tokenize=True, return_dict=True, add_generation_prompt=agp, **kwargs
            )
            ids = list(enc["input_ids"])
            # apply_chat_template tokenizes with add_special_tokens=False: the template writes BOS.
            assert ids == tok(text, add_special_tokens=False)["input_ids"], (spec.name, case["name"])
            text_gen = tok.apply_chat_template(
                case["messages"],
                chat_template=generation_template,
                tokenize=False,
                add_generation_prompt=agp,
                **kwargs,
            )
            assert text_gen == text, (spec.name, case["name"], text_gen, text)
            masked = tok.apply_chat_template(
                case["messages"],
                chat_template=generation_template,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
                add_generation_prompt=agp,
                **kwargs,
            )
            assert list(masked["input_ids"]) == ids
            mask = list(masked["assistant_masks"])
            cases.append(
                {
                    "name": case["name"],
                    "messages": case["messages"],
                    "add_generation_prompt": agp,
                    "template_kwargs": kwargs,
                    "text": text,
                    "input_ids": ids,
                    "assistant_masks": mask,
                    "assistant_text": tok.decode([i for i, m in zip(ids, mask) if m]),
                }
            )
        result["tokenizers"][spec.name] = {
            "tokenizer_dir": f"fixtures/tokenizers/{spec.name}",
            "family": spec.family,
            "cases": cases,
        }
    (out / "reference.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"chat reference -> {out / 'reference.json'}")


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------


@dataclass
class ModelSpec:
    name: str
    family: str  # a model_type: "llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "smollm3"
    variants: list[str]
    config: dict
    seed: int
    save_dtype: torch.dtype = torch.float32
    max_shard_size: int | None = None
    tokenizer: str | None = None
    generation_config: dict | None = None


LLAMA_BASE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=128,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
)

MODEL_SPECS = [
    ModelSpec(
        name="llama_gqa_rope_llama3",
        family="llama",
        variants=["gqa_4q_2kv", "untied_embeddings", "rope_llama3", "tokenizer_llama3"],
        config=dict(
            LLAMA_BASE,
            vocab_size=300,
            tie_word_embeddings=False,
            max_position_embeddings=1024,  # = factor x original_max_position_embeddings
            # Small theta and short original context put the 4 rotary frequencies of head_dim 8
            # into all three llama3 bands (kept, smoothed, scaled by `factor`), so the scaling
            # visibly changes the logits within 14 positions.
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=100.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=128,
            ),
        ),
        seed=1,
        tokenizer="llama3",
        # As in meta-llama/Llama-3.2-*-Instruct generation_config.json (minus <|eom_id|>, which
        # the tiny tokenizer does not carry).
        generation_config=dict(do_sample=True, temperature=0.6, top_p=0.9),
    ),
    ModelSpec(
        name="llama_rope_linear",
        family="llama",
        variants=["gqa_4q_2kv", "untied_embeddings", "rope_linear"],
        config=dict(
            LLAMA_BASE,
            vocab_size=128,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="linear", rope_theta=100.0, factor=2.0),
        ),
        seed=2,
    ),
    ModelSpec(
        name="llama_rope_yarn",
        family="llama",
        variants=["gqa_4q_2kv", "untied_embeddings", "rope_yarn"],
        config=dict(
            LLAMA_BASE,
            vocab_size=128,
            tie_word_embeddings=False,
            # max_position_embeddings / original_max_position_embeddings == factor, so the
            # transformers 4.x rule (factor := max_pos / original_max_pos when the latter is
            # present) and the 5.x rule (use `factor`) agree.
            max_position_embeddings=128,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=100.0,
                factor=4.0,
                original_max_position_embeddings=32,
                beta_fast=32.0,
                beta_slow=1.0,
            ),
        ),
        seed=3,
    ),
    ModelSpec(
        name="llama_mqa_tied",
        family="llama",
        variants=["mqa_4q_1kv", "tied_embeddings", "rope_default"],
        config=dict(
            LLAMA_BASE,
            vocab_size=128,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        seed=4,
    ),
    ModelSpec(
        name="llama_bf16",
        family="llama",
        variants=["gqa_4q_2kv", "untied_embeddings", "rope_default", "bf16_on_disk"],
        config=dict(
            LLAMA_BASE,
            vocab_size=128,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        seed=5,
        save_dtype=torch.bfloat16,
    ),
    ModelSpec(
        name="llama_sharded",
        family="llama",
        variants=["gqa_4q_2kv", "untied_embeddings", "rope_default", "sharded_safetensors"],
        config=dict(
            LLAMA_BASE,
            vocab_size=128,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        seed=6,
        max_shard_size=40_000,  # bytes: ~112 KB of f32 weights -> 3+ shards
    ),
    ModelSpec(
        name="qwen2_bias_tied",
        family="qwen2",
        variants=["gqa_4q_2kv", "qkv_bias", "tied_embeddings", "rope_default", "tokenizer_qwen2"],
        config=dict(
            vocab_size=300,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            max_position_embeddings=128,
            tie_word_embeddings=True,
            use_sliding_window=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        seed=7,
        tokenizer="qwen2",
        # As in Qwen/Qwen2.5-*-Instruct generation_config.json.
        generation_config=dict(
            do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05
        ),
    ),
    ModelSpec(
        name="qwen3_qknorm",
        family="qwen3",
        variants=["gqa_4q_2kv", "qk_norm", "explicit_head_dim", "untied_embeddings", "rope_default"],
        config=dict(
            vocab_size=128,
            hidden_size=32,
            head_dim=16,  # 4 heads x 16 = 64 != hidden 32 (hidden / heads would be 8)
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            max_position_embeddings=128,
            tie_word_embeddings=False,
            attention_bias=False,
            use_sliding_window=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        seed=8,
    ),
]

# Issue 16: the block variants (Gemma 2, Gemma 3 text, SmolLM3, gated relu^2). The windows and
# caps are small so that the 12-token references exercise them: a sliding window of 4 positions,
# soft-caps a few logits wide.
MODEL_SPECS += [
    ModelSpec(
        name="gemma2_softcap_sliding",
        family="gemma2",
        variants=[
            "gqa_4q_2kv", "geglu_tanh", "sandwich_norm", "unit_offset_norm", "embedding_scale",
            "query_pre_attn_scalar", "attn_softcap", "final_softcap", "sliding_window_alternating",
            "tied_embeddings",
        ],
        config=dict(
            vocab_size=128,
            hidden_size=32,
            head_dim=16,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            max_position_embeddings=128,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=24,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=4.0,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            tie_word_embeddings=True,
        ),
        seed=11,
    ),
    ModelSpec(
        name="gemma3_text_local_rope",
        family="gemma3_text",
        variants=[
            "gqa_4q_2kv", "qk_norm_unit_offset", "sandwich_norm", "embedding_scale",
            "sliding_window_pattern", "local_rope_theta", "global_rope_linear", "untied_embeddings",
        ],
        config=dict(
            vocab_size=128,
            hidden_size=32,
            head_dim=16,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            max_position_embeddings=128,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=20,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": dict(rope_type="linear", factor=2.0, rope_theta=10000.0),
                "sliding_attention": dict(rope_type="default", rope_theta=100.0),
            },
            tie_word_embeddings=False,
        ),
        seed=12,
    ),
    ModelSpec(
        name="smollm3_nope",
        family="smollm3",
        variants=["gqa_4q_2kv", "nope_layers", "tied_embeddings", "rope_default"],
        config=dict(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            max_position_embeddings=128,
            hidden_act="silu",
            no_rope_layers=[1, 0, 1, 0],
            # SmolLM3Config's defaults (128004, ...) lie outside this vocabulary.
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
            use_sliding_window=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            tie_word_embeddings=True,
        ),
        seed=13,
    ),
    ModelSpec(
        name="llama_relu2",
        family="llama",
        variants=["gqa_4q_2kv", "relu2_gated_mlp", "untied_embeddings"],
        config=dict(
            LLAMA_BASE,
            vocab_size=128,
            hidden_act="relu2",
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        seed=15,
    ),
]

# Issue 16: mixtures of experts. 4 experts, top 2, so every expert sees some of the 20 tokens.
MOE_BASE = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    num_experts_per_tok=2,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0),
    tie_word_embeddings=False,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)
MODEL_SPECS += [
    ModelSpec(
        name="mixtral_moe",
        family="mixtral",
        variants=["moe_4_experts_top2", "renormalized_topk", "gqa_4q_2kv", "untied_embeddings"],
        config=dict(MOE_BASE, num_local_experts=4, rms_norm_eps=1e-5, sliding_window=None),
        seed=16,
    ),
    ModelSpec(
        name="qwen2_moe_shared",
        family="qwen2_moe",
        variants=[
            "moe_4_experts_top2", "shared_expert_sigmoid_gate", "mlp_only_layers", "qkv_bias",
            "no_topk_renormalization",
        ],
        config=dict(
            MOE_BASE,
            num_experts=4,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=40,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
            rms_norm_eps=1e-6,
            use_sliding_window=False,
        ),
        seed=17,
    ),
    ModelSpec(
        name="qwen3_moe",
        family="qwen3_moe",
        variants=["moe_4_experts_top2", "renormalized_topk", "qk_norm", "head_dim_default"],
        config=dict(
            MOE_BASE,
            num_experts=4,
            moe_intermediate_size=24,
            norm_topk_prob=True,
            rms_norm_eps=1e-6,
            use_sliding_window=False,
        ),
        seed=18,
    ),
    ModelSpec(
        name="olmoe",
        family="olmoe",
        variants=["moe_4_experts_top2", "whole_projection_qk_norm", "clip_qkv"],
        config=dict(MOE_BASE, num_experts=4, rms_norm_eps=1e-5, clip_qkv=2.0),
        seed=19,
    ),
]

# AFMoE (Arcee Trinity): gated attention, sandwich norms, sliding-window RoPE layers and a global
# NoPE layer, a sigmoid router with a (random, nonzero) expert_bias and route_scale, a shared
# expert, one dense first layer, scaled embeddings (mup_enabled).
MODEL_SPECS += [
    ModelSpec(
        name="afmoe_gated",
        family="afmoe",
        variants=[
            "gated_attention", "sandwich_norm", "qk_norm", "sliding_rope_global_nope",
            "sigmoid_router_expert_bias", "route_scale", "shared_expert", "dense_first_layer",
            "mup_embedding_scale",
        ],
        config=dict(
            MOE_BASE,
            num_hidden_layers=3,
            head_dim=8,
            moe_intermediate_size=24,
            num_experts=4,
            num_shared_experts=1,
            num_dense_layers=1,
            route_scale=2.5,
            global_attn_every_n_layers=2,
            sliding_window=4,
            mup_enabled=True,
            rms_norm_eps=1e-5,
        ),
        seed=20,
    ),
]

# DeepSeek-V3: multi-head latent attention (a low-rank query, the latent and shared rotated key,
# interleaved RoPE, a value width unlike the query/key width), YaRN with mscale_all_dim (which
# scales the attention scores), and the sigmoid router choosing within the 2 best of 4 expert
# groups on score + a (random, nonzero) e_score_correction_bias, times routed_scaling_factor;
# one shared expert, one dense first layer.
MODEL_SPECS += [
    ModelSpec(
        name="deepseek_v3_mla",
        family="deepseek_v3",
        variants=[
            "mla_low_rank_query", "mla_interleaved_rope", "v_head_dim_differs", "yarn_mscale_all_dim",
            "sigmoid_group_limited_routing", "e_score_correction_bias", "routed_scaling_factor",
            "shared_expert", "dense_first_layer",
        ],
        config=dict(
            MOE_BASE,
            num_hidden_layers=3,
            num_key_value_heads=4,
            q_lora_rank=16,
            kv_lora_rank=12,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=12,
            n_routed_experts=8,
            n_group=4,
            topk_group=2,
            moe_intermediate_size=16,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            rope_interleave=True,
            num_mtp_layers=0,
            rms_norm_eps=1e-6,
            rope_parameters=dict(
                rope_type="yarn", rope_theta=10000.0, factor=2.0, mscale=1.0, mscale_all_dim=1.0,
                original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0,
            ),
        ),
        seed=21,
    ),
    # The other MLA layout (a direct q_proj, RoPE over halves, biases on the "a" projections and
    # o_proj) and two multi-token prediction modules in DeepSeek-V3's checkpoint layout (see
    # add_mtp_modules), with transformers' MtpModel as the reference of their logits.
    ModelSpec(
        name="deepseek_v3_mtp",
        family="deepseek_v3",
        variants=[
            "mla_direct_query", "mla_half_rope", "attention_bias", "mtp_2_modules",
            "sigmoid_routing_no_group_limit", "no_topk_renormalization",
        ],
        config=dict(
            MOE_BASE,
            num_hidden_layers=2,
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=12,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=8,
            attention_bias=True,
            n_routed_experts=4,
            n_group=1,
            topk_group=1,
            moe_intermediate_size=16,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
            rope_interleave=False,
            num_mtp_layers=2,
            rms_norm_eps=1e-6,
        ),
        seed=22,
    ),
]

# Checkpoints that get a copy whose config.json is hand-converted to the other config style.
CONVERTED_COPIES = {"llama_gqa_rope_llama3": "llama_gqa_rope_llama3_v4config"}
# The transformers_version string written into hand-converted 4.x-style configs.
V4_VERSION_STRING = "4.46.3"


def make_config(spec: ModelSpec, tokenizer_ids: dict | None):
    cfg = dict(spec.config)
    if tokenizer_ids is not None:
        cfg.update(tokenizer_ids)
    model_type = {
        "llama": "llama",
        "qwen2": "qwen2",
        "qwen3": "qwen3",
        "gemma2": "gemma2",
        "gemma3_text": "gemma3_text",
        "smollm3": "smollm3",
        "mixtral": "mixtral",
        "qwen2_moe": "qwen2_moe",
        "qwen3_moe": "qwen3_moe",
        "olmoe": "olmoe",
        "afmoe": "afmoe",
        "deepseek_v3": "deepseek_v3",
    }[spec.family]
    return AutoConfig.for_model(model_type, **cfg)


def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Deterministic init that makes logits O(1) so parity tests are sensitive to mistakes.

    HF's own init (std 0.02) gives near-uniform logits where many bugs hide below 1e-4. Here:
    linear weights ~ N(0, 1/fan_in), biases ~ N(0, 0.1^2), embeddings ~ N(0, 0.25^2) (also the lm_head when tied), and every
    RMSNorm weight ~ 1 + N(0, 0.2^2) so a loader that ignores a norm weight is caught.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(0.25 * torch.randn(p.shape, generator=gen))
            else:
                # 2-D [out, in]; transformers 5.x keeps MoE experts as 3-D [experts, out, in].
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
        # DeepSeek-V3's selection bias is a buffer (zeros by default): nonzero, so a loader that
        # ignores it chooses other experts.
        for name, b in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))


def add_mtp_modules(model, out: Path, seed: int) -> None:
    """Appends transformers' MtpModel weights to the saved checkpoint under DeepSeek-V3's names:
    `model.layers.{L + k}.{enorm,hnorm,eh_proj}`, the block's tensors directly under the layer,
    `shared_head.norm` (MtpModel's post_norm), plus the copies of the embedding
    (`embed_tokens`) and LM head (`shared_head.head`) that DeepSeek's checkpoints carry."""
    from transformers.modeling_layers import MtpModel

    n_layers = model.config.num_hidden_layers
    mtp = MtpModel(model, model.config.num_mtp_layers)
    gen = torch.Generator().manual_seed(5000 + seed)
    with torch.no_grad():
        for name, p in sorted(mtp.named_parameters()):
            if name.startswith(("embed_tokens.", "shared_head.")):
                continue  # the main model's (tied)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        for name, b in sorted(mtp.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))
    tensors = load_file(str(out / "model.safetensors"))
    state = dict(mtp.named_parameters())
    state.update({n: b for n, b in mtp.named_buffers() if n.endswith("e_score_correction_bias")})
    for name, t in state.items():
        if name.startswith(("embed_tokens.", "shared_head.")):
            continue
        k, rest = name.removeprefix("layers.").split(".", 1)
        prefix = f"model.layers.{n_layers + int(k)}."
        rest = rest.removeprefix("mtp_block.")
        rest = {"post_norm.weight": "shared_head.norm.weight"}.get(rest, rest)
        t = t.detach().float()
        if rest == "mlp.experts.gate_up_proj":
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                tensors[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                tensors[f"{prefix}mlp.experts.{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif rest == "mlp.experts.down_proj":
            for e in range(t.shape[0]):
                tensors[f"{prefix}mlp.experts.{e}.down_proj.weight"] = t[e].contiguous()
        else:
            tensors[prefix + rest] = t.contiguous()
    for k in range(model.config.num_mtp_layers):
        prefix = f"model.layers.{n_layers + k}."
        tensors[prefix + "embed_tokens.weight"] = model.model.embed_tokens.weight.detach().float().clone()
        tensors[prefix + "shared_head.head.weight"] = model.lm_head.weight.detach().float().clone()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return mtp


def mtp_reference(loaded, mtp_in_memory, out: Path, inputs: dict) -> dict:
    """Each MTP module's logits on inputs a and b, from transformers' MtpModel loaded from the
    checkpoint (checked equal to the in-memory one, so the names are right). Depth d's entry j
    joins the previous hidden state j (the main model's final-normed one for d = 0) with the
    embedding of token j + 1 + d at position j + 1 + d, and predicts token j + 2 + d."""
    from transformers.modeling_layers import MtpModel

    n_layers = loaded.config.num_hidden_layers
    # DeepSeek-V3 registers its MTP weights as layer 61; this checkpoint's are layer n_layers.
    loaded._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{n_layers + k}\..*" for k in range(loaded.config.num_mtp_layers)]
    mtp = MtpModel.from_pretrained(loaded)
    mtp.eval()
    for (n, a), (m, b) in zip(sorted(mtp.state_dict().items()), sorted(mtp_in_memory.state_dict().items())):
        assert n == m and torch.equal(a, b.float()), n
    out_tensors = {}
    losses = {}
    with torch.no_grad():
        for which in ("a", "b"):
            ids = inputs[f"input_ids_{which}"]
            T = ids.shape[1]
            h = loaded.model(input_ids=ids).last_hidden_state
            hs = loaded(input_ids=ids, output_hidden_states=True).hidden_states[-1]
            assert torch.equal(h, hs)
            prev = h
            for d in range(loaded.config.num_mtp_layers):
                n = T - 1 - d
                pos = torch.arange(1 + d, T)[None]
                hid = mtp.forward_layer(d, prev[:, :n], pos, None, input_ids=ids[:, 1 + d : T])
                logits = mtp._project_to_logits(hid).float()
                out_tensors[f"mtp{d}_logits_{which}"] = logits.contiguous()
                if which == "a" and n > 1:
                    losses[f"mtp{d}_loss_a"] = float(F.cross_entropy(logits[0, :-1], ids[0, 2 + d :]))
                prev = hid
    save_tensors = load_file(str(out / "reference.safetensors"))
    save_tensors.update(out_tensors)
    save_file(save_tensors, str(out / "reference.safetensors"), metadata={"format": "pt"})
    return losses


def load_f32(path: Path):
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    return model


def reference_inputs(vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + seed)
    ids_a = torch.randint(0, vocab_size, (1, LEN_A), generator=gen, dtype=torch.int64)
    ids_b = torch.randint(0, vocab_size, (1, LEN_B), generator=gen, dtype=torch.int64)
    batch = torch.full((2, LEN_A), PAD_ID, dtype=torch.int64)
    batch[0] = ids_a[0]
    batch[1, :LEN_B] = ids_b[0]
    mask = torch.zeros((2, LEN_A), dtype=torch.int64)
    mask[0] = 1
    mask[1, :LEN_B] = 1
    return {
        "input_ids_a": ids_a,
        "input_ids_b": ids_b,
        "batch_input_ids": batch,
        "batch_attention_mask": mask,
    }


def forward_logits(model, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        logits_a = model(input_ids=inputs["input_ids_a"]).logits.float()
        logits_b = model(input_ids=inputs["input_ids_b"]).logits.float()
        batch_logits = model(
            input_ids=inputs["batch_input_ids"], attention_mask=inputs["batch_attention_mask"]
        ).logits.float()
    return {"logits_a": logits_a, "logits_b": logits_b, "batch_logits": batch_logits}


GREEDY_NEW_TOKENS = 8


GREEDY_MIN_MARGIN = 0.02
GREEDY_MAX_TRIES = 200


def greedy_run(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Greedy decoding by full recomputation (no cache), no EOS stop.

    position_ids = cumsum(mask) - 1: positions start at 0 at each row's first real token
    (MODEL_API's convention for left-padded generation). Returns the extended ids and the
    smallest top-1 minus top-2 logit gap over all rows and steps.
    """
    ids, mask = ids.clone(), mask.clone()
    gap = math.inf
    with torch.no_grad():
        for _ in range(GREEDY_NEW_TOKENS):
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
            top2 = logits.topk(2, dim=-1).values
            gap = min(gap, float((top2[:, 0] - top2[:, 1]).min()))
            nxt = logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
    return ids, gap


def greedy_reference(model, vocab_size: int, seed: int) -> tuple[dict[str, torch.Tensor], dict]:
    """Greedy continuations of a LEFT-padded batch of two prompts (lengths LEN_A and LEN_B).

    The prompts are drawn from a seeded generator, retrying until every greedy choice wins by at
    least GREEDY_MIN_MARGIN logits, so that f32 rounding differences in another implementation
    cannot flip a token (random-weight models have near-ties). Cross-checked against the short
    prompt decoded alone and against `model.generate` (which uses the KV cache).
    """
    gen = torch.Generator().manual_seed(3000 + seed)
    for attempt in range(GREEDY_MAX_TRIES):
        p_a = torch.randint(0, vocab_size, (1, LEN_A), generator=gen, dtype=torch.int64)
        p_b = torch.randint(0, vocab_size, (1, LEN_B), generator=gen, dtype=torch.int64)
        prompt = torch.full((2, LEN_A), PAD_ID, dtype=torch.int64)
        prompt[0] = p_a[0]
        prompt[1, LEN_A - LEN_B :] = p_b[0]
        pmask = torch.zeros((2, LEN_A), dtype=torch.int64)
        pmask[0] = 1
        pmask[1, LEN_A - LEN_B :] = 1
        batch, gap = greedy_run(model, prompt, pmask)
        if gap >= GREEDY_MIN_MARGIN:
            break
    else:
        raise SystemExit(f"no greedy prompt with margin >= {GREEDY_MIN_MARGIN} in {GREEDY_MAX_TRIES} tries")
    single, _ = greedy_run(model, p_b, torch.ones_like(p_b))
    # Row 1 of the left-padded batch must continue exactly like the short prompt alone.
    assert torch.equal(batch[1, LEN_A:], single[0, LEN_B:]), (batch, single)
    with torch.no_grad():
        # A fresh config with repetition_penalty 1: the checkpoint's own generation_config (e.g.
        # Qwen's repetition_penalty 1.05) must not apply to plain greedy decoding.
        plain_greedy = GenerationConfig(
            max_new_tokens=GREEDY_NEW_TOKENS,
            min_new_tokens=GREEDY_NEW_TOKENS,
            do_sample=False,
            repetition_penalty=1.0,
            pad_token_id=PAD_ID,
            eos_token_id=None,
        )
        generated = model.generate(input_ids=prompt, attention_mask=pmask, generation_config=plain_greedy)
    assert torch.equal(generated, batch), (generated, batch)
    tensors = {
        "greedy_prompt_ids": prompt,
        "greedy_prompt_mask": pmask,
        "greedy_output_ids": batch,
    }
    meta = {
        "greedy_new_tokens": GREEDY_NEW_TOKENS,
        "greedy_min_top2_margin": gap,
        "greedy_prompt_attempt": attempt,
    }
    return tensors, meta


def next_token_loss(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="mean")


def checkpoint_named_grads(model) -> dict:
    """Parameter gradients under the names the checkpoint files use.

    transformers 5.x holds MoE experts as fused 3-D parameters (`mlp.experts.gate_up_proj`
    [E, 2I, h] = gate rows then up rows, `mlp.experts.down_proj` [E, h, I]) and Mixtral's block
    as `mlp`, but saves the hub layout: one 2-D tensor per expert (`experts.{e}.gate_proj`, or
    Mixtral's `block_sparse_moe.experts.{e}.w1|w3|w2`). Split them the same way."""
    mixtral = model.config.model_type == "mixtral"
    out = {}
    for name, p in model.named_parameters():
        # A parameter outside the graph (AFMoE's expert_bias, requires_grad=False): gradient 0.
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        if ".mlp.experts." not in name and not (mixtral and ".mlp.gate." in name):
            out[name] = g
            continue
        prefix = name.split(".mlp.")[0]
        block = "block_sparse_moe" if mixtral else "mlp"
        if name.endswith("mlp.gate.weight"):
            out[f"{prefix}.{block}.gate.weight"] = g
        elif name.endswith("experts.gate_up_proj"):
            inter = g.shape[1] // 2
            for e in range(g.shape[0]):
                gate, up = ("w1", "w3") if mixtral else ("gate_proj", "up_proj")
                out[f"{prefix}.{block}.experts.{e}.{gate}.weight"] = g[e, :inter]
                out[f"{prefix}.{block}.experts.{e}.{up}.weight"] = g[e, inter:]
        elif name.endswith("experts.down_proj"):
            for e in range(g.shape[0]):
                down = "w2" if mixtral else "down_proj"
                out[f"{prefix}.{block}.experts.{e}.{down}.weight"] = g[e]
        else:
            raise SystemExit(f"unmapped MoE parameter {name}")
    # DeepSeek-V3's selection bias is a checkpoint tensor held as a buffer: gradient 0.
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            out[name] = torch.zeros_like(b)
    return out


def grad_reference(model, ids_a: torch.Tensor, seed: int) -> tuple[float, dict, dict]:
    model.zero_grad(set_to_none=True)
    loss = next_token_loss(model, ids_a)
    # The HF loss (labels=input_ids, shifted inside) must be the same number.
    with torch.no_grad():
        hf_loss = model(input_ids=ids_a, labels=ids_a).loss
    assert abs(hf_loss.item() - loss.item()) < 1e-5, (hf_loss.item(), loss.item())
    loss.backward()
    named = checkpoint_named_grads(model)
    grad_norms = {n: float(g.double().norm()) for n, g in sorted(named.items())}
    gen = torch.Generator().manual_seed(2000 + seed)
    wanted = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.bias",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.norm.weight",
        "lm_head.weight",
        # Sandwich norms (Gemma); absent elsewhere, and listed last so the samples drawn for
        # the older fixtures are unchanged.
        "model.layers.0.pre_feedforward_layernorm.weight",
        "model.layers.1.post_feedforward_layernorm.weight",
        "model.layers.1.self_attn.k_norm.weight",
        # Mixture of experts (router, an expert, the shared expert's gate).
        "model.layers.0.mlp.gate.weight",
        "model.layers.0.block_sparse_moe.gate.weight",
        "model.layers.0.mlp.experts.1.up_proj.weight",
        "model.layers.0.block_sparse_moe.experts.1.w3.weight",
        "model.layers.0.mlp.shared_expert_gate.weight",
        # AFMoE: the attention gate and the sigmoid router.
        "model.layers.1.self_attn.gate_proj.weight",
        "model.layers.1.mlp.router.gate.weight",
        # DeepSeek-V3: the latent attention's projections and norm, a routed and the shared expert.
        "model.layers.0.self_attn.kv_b_proj.weight",
        "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.1.self_attn.q_b_proj.weight",
        "model.layers.2.self_attn.q_a_proj.weight",
        "model.layers.2.self_attn.kv_a_layernorm.weight",
        "model.layers.2.mlp.experts.3.down_proj.weight",
        "model.layers.2.mlp.shared_experts.up_proj.weight",
    ]
    samples = {}
    for n in wanted:
        if n not in named:
            continue
        g = named[n].reshape(-1)
        if n == "model.embed_tokens.weight":
            # Only rows of tokens that occur have a gradient (plus lm_head rows when tied); sample
            # from rows of the input so most samples are non-zero.
            hidden = named[n].shape[1]
            rows = ids_a[0].unique()
            pick_rows = rows[torch.randint(0, len(rows), (8,), generator=gen)]
            cols = torch.randint(0, hidden, (8,), generator=gen)
            idx = (pick_rows * hidden + cols).tolist()
        else:
            idx = torch.randperm(g.numel(), generator=gen)[:8].tolist()
        samples[n] = [[int(i), float(g[i])] for i in sorted(set(idx))]
    model.zero_grad(set_to_none=True)
    return float(loss.item()), grad_norms, samples


def bf16_autocast_error(model, inputs, logits: dict) -> dict:
    """PyTorch's own bf16 error on this checkpoint: `torch.autocast("cpu", bfloat16)` logits
    against the f32 reference, and the worst relative L2 distance of a parameter gradient of the
    next-token loss on input a. stoke's bf16 tests hold the block variants (Gemma's scaled
    embeddings and (1 + w) norms widen bf16's error) to these figures."""
    out = {}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for which in ("a", "b"):
            got = model(input_ids=inputs[f"input_ids_{which}"]).logits.float()
            out[f"logits_{which}_max_abs_diff"] = float((got - logits[f"logits_{which}"]).abs().max())
    grads = {}
    for autocast in (False, True):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = next_token_loss(model, inputs["input_ids_a"])
        loss.backward()
        grads[autocast] = {
            n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None
        }
    model.zero_grad(set_to_none=True)
    out["grad_worst_relative_l2"] = max(
        float((grads[True][n] - g).norm() / g.norm().clamp(min=1e-12)) for n, g in grads[False].items()
    )
    return out


def to_v4_config(cfg: dict) -> dict:
    """Hand-converts a transformers 5.x config.json (rope_parameters) to the 4.x style."""
    out = {}
    for k, v in cfg.items():
        if k == "rope_parameters":
            rp = dict(v)
            out["rope_theta"] = rp.pop("rope_theta")
            rope_type = rp.pop("rope_type")
            out["rope_scaling"] = None if rope_type == "default" else {"rope_type": rope_type, **rp}
        elif k == "dtype":
            out["torch_dtype"] = v
        elif k == "transformers_version":
            out[k] = V4_VERSION_STRING
        else:
            out[k] = v
    return dict(sorted(out.items()))


def rope_effect(spec: ModelSpec, model_dir: Path, inputs, logits_a: torch.Tensor) -> float | None:
    """Max |logit difference| between the checkpoint and the same weights with plain RoPE."""
    rp = spec.config.get("rope_parameters", {})
    if rp.get("rope_type", "default") == "default":
        return None
    cfg = AutoConfig.from_pretrained(str(model_dir))
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": rp["rope_theta"]}
    plain = AutoModelForCausalLM.from_pretrained(
        str(model_dir), config=cfg, dtype=torch.float32, attn_implementation="eager"
    )
    plain.eval()
    with torch.no_grad():
        other = plain(input_ids=inputs["input_ids_a"]).logits
    return float((other - logits_a).abs().max())


def build_model(spec: ModelSpec, tokenizer_dirs: dict[str, Path]) -> Path:
    out = FIXTURES / "models" / spec.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tok_ids = None
    tok_dir = None
    if spec.tokenizer is not None:
        tok_dir = tokenizer_dirs[spec.tokenizer]
        raw = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        assert spec.config["vocab_size"] >= raw.get_vocab_size(with_added_tokens=True)
        if spec.tokenizer == "llama3":
            bos = raw.token_to_id("<|begin_of_text|>")
            eos = [raw.token_to_id("<|end_of_text|>"), raw.token_to_id("<|eot_id|>")]
            tok_ids = {"bos_token_id": bos, "eos_token_id": eos}
            gen_ids = {"bos_token_id": bos, "eos_token_id": eos}
        else:
            endoftext = raw.token_to_id("<|endoftext|>")
            im_end = raw.token_to_id("<|im_end|>")
            # Qwen2.5-Instruct: config.json eos = <|im_end|>; generation_config.json eos =
            # [<|im_end|>, <|endoftext|>], pad = bos = <|endoftext|>.
            tok_ids = {"bos_token_id": endoftext, "eos_token_id": im_end}
            gen_ids = {
                "bos_token_id": endoftext,
                "pad_token_id": endoftext,
                "eos_token_id": [im_end, endoftext],
            }
    config = make_config(spec, tok_ids)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    init_weights(model, spec.seed)
    model = model.to(spec.save_dtype)
    save_kwargs = {}
    if spec.max_shard_size is not None:
        save_kwargs["max_shard_size"] = spec.max_shard_size
    model.save_pretrained(str(out), **save_kwargs)
    mtp_in_memory = None
    if getattr(model.config, "num_mtp_layers", 0) and spec.family == "deepseek_v3":
        mtp_in_memory = add_mtp_modules(model, out, spec.seed)
    if spec.tokenizer is not None:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tok_dir / f, out / f)
        GenerationConfig(**gen_ids, **spec.generation_config).save_pretrained(str(out))
    # Without a tokenizer, generation_config.json is the default one save_pretrained derives
    # from the config (bos 1 / eos 2 for llama).

    if spec.max_shard_size is not None:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        shards = sorted(set(index["weight_map"].values()))
        assert len(shards) >= 2, shards
    else:
        assert (out / "model.safetensors").exists()

    # References come from the checkpoint as reloaded from disk, in float32.
    loaded = load_f32(out)
    if spec.save_dtype == torch.float32:
        orig = dict(model.named_parameters())
        for n, p in loaded.named_parameters():
            assert torch.equal(p, orig[n].float()), n
    else:
        orig = dict(model.named_parameters())
        for n, p in loaded.named_parameters():
            assert p.dtype == torch.float32
            assert torch.equal(p, orig[n].float()), n  # exact bf16 -> f32 upcast
    vocab = config.vocab_size
    inputs = reference_inputs(vocab, spec.seed)
    logits = forward_logits(loaded, inputs)
    # Right padding must not change the valid positions (up to float reassociation).
    d_a = (logits["batch_logits"][0] - logits["logits_a"][0]).abs().max().item()
    d_b = (logits["batch_logits"][1, :LEN_B] - logits["logits_b"][0]).abs().max().item()
    assert d_a < 1e-5 and d_b < 1e-5, (d_a, d_b)
    greedy, greedy_meta = greedy_reference(loaded, vocab, spec.seed)
    loss_a, grad_norms, grad_samples = grad_reference(loaded, inputs["input_ids_a"], spec.seed)
    tensors = {**inputs, **logits, **greedy}
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, str(out / "reference.safetensors"), metadata={"format": "pt"})
    mtp_losses = {}
    if mtp_in_memory is not None:
        mtp_losses = mtp_reference(loaded, mtp_in_memory, out, inputs)
    effect = rope_effect(spec, out, inputs, logits["logits_a"])
    config_json = json.loads((out / "config.json").read_text())
    reference = {
        "family": spec.family,
        "variants": spec.variants,
        "config_style": "transformers-5.x (rope_parameters)"
        if "rope_parameters" in config_json
        else "transformers-4.x (rope_theta + rope_scaling)",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "dtype_on_disk": str(spec.save_dtype).replace("torch.", ""),
        "reference_dtype": "float32",
        "attn_implementation": "eager",
        "pad_id": PAD_ID,
        "seq_len_a": LEN_A,
        "seq_len_b": LEN_B,
        "loss_a": loss_a,
        "loss_definition": "mean over positions t=0..La-2 of cross_entropy(logits_a[0,t], input_ids_a[0,t+1])",
        "grad_norms": grad_norms,
        "grad_samples": grad_samples,
        "max_abs_diff_batch_vs_single": max(d_a, d_b),
        **greedy_meta,
        **mtp_losses,
    }
    if effect is not None:
        reference["rope_scaling_effect_max_abs_logit_diff"] = effect
    if spec.family in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):  # AFMoE has no aux loss in HF
        # HF's auxiliary load-balancing loss (`load_balancing_loss_func`, before
        # router_aux_loss_coef) on input a and on the right-padded batch with its mask.
        with torch.no_grad():
            out_a = loaded(input_ids=inputs["input_ids_a"], output_router_logits=True)
            out_batch = loaded(
                input_ids=inputs["batch_input_ids"],
                attention_mask=inputs["batch_attention_mask"],
                output_router_logits=True,
            )
        reference["aux_loss_a"] = float(out_a.aux_loss)
        reference["aux_loss_batch"] = float(out_batch.aux_loss)
    if spec.family not in ("llama", "qwen2", "qwen3") or "relu2_gated_mlp" in spec.variants:
        # Block variants and MoE: PyTorch's own bf16 error bounds stoke's (tests/bf16.rs).
        reference["bf16_autocast"] = bf16_autocast_error(loaded, inputs, logits)
    (out / "reference.json").write_text(json.dumps(reference, indent=2) + "\n")
    print(f"model {spec.name}: loss_a={loss_a:.6f} rope_effect={effect} -> {out}")
    return out


def build_converted_copy(src: Path, dst_name: str) -> Path:
    dst = FIXTURES / "models" / dst_name
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    cfg = json.loads((src / "config.json").read_text())
    if "rope_parameters" in cfg:
        new_cfg = to_v4_config(cfg)
        style = "transformers-4.x (rope_theta + rope_scaling), hand-converted"
    else:
        raise SystemExit("installed transformers wrote a 4.x config; add a 4.x -> 5.x converter")
    (dst / "config.json").write_text(json.dumps(new_cfg, indent=2) + "\n")
    # The converted config must load to the same model: same logits bit for bit.
    ref = load_file(str(dst / "reference.safetensors"))
    model = load_f32(dst)
    inputs = {k: ref[k] for k in ("input_ids_a", "input_ids_b", "batch_input_ids", "batch_attention_mask")}
    logits = forward_logits(model, inputs)
    for k, v in logits.items():
        assert torch.equal(v, ref[k]), (dst_name, k, (v - ref[k]).abs().max())
    reference = json.loads((dst / "reference.json").read_text())
    reference["config_style"] = style
    reference["converted_from"] = f"fixtures/models/{src.name}"
    (dst / "reference.json").write_text(json.dumps(reference, indent=2) + "\n")
    print(f"converted copy {dst_name} <- {src.name}")
    return dst


def verify_all_models() -> None:
    """Reloads every checkpoint and recomputes its reference from scratch."""
    failures = []
    for d in sorted((FIXTURES / "models").iterdir()):
        ref = load_file(str(d / "reference.safetensors"))
        model = load_f32(d)
        inputs = {k: ref[k] for k in ("input_ids_a", "input_ids_b", "batch_input_ids", "batch_attention_mask")}
        logits = forward_logits(model, inputs)
        worst = max(float((logits[k] - ref[k]).abs().max()) for k in logits)
        meta = json.loads((d / "reference.json").read_text())
        loss = next_token_loss(model, ref["input_ids_a"]).item()
        if worst == 0.0 and abs(loss - meta["loss_a"]) < 1e-6:
            print(f"verify {d.name}: logits identical, loss {loss:.6f}")
        else:
            print(f"verify {d.name}: FAILED: logits differ by {worst:.3g}, loss {loss} vs {meta['loss_a']}")
            failures.append(d.name)
    if failures:
        raise SystemExit(f"fixtures that did not recompute bit for bit: {failures}")


# ----------------------------------------------------------------------------------------------
# --check-saved
# ----------------------------------------------------------------------------------------------


def check_saved(src_dir: Path, saved_dir: Path) -> int:
    ref = load_file(str(src_dir / "reference.safetensors"))
    # from_pretrained silently random-initializes missing tensors; make that a failure.
    model, info = AutoModelForCausalLM.from_pretrained(
        str(saved_dir), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    model.eval()
    missing = sorted(info.get("missing_keys", []))
    mismatched = [str(m) for m in info.get("mismatched_keys", [])]
    unexpected = sorted(info.get("unexpected_keys", []))
    if unexpected:
        print(f"note: tensors transformers did not use: {unexpected}")
    inputs = {k: ref[k] for k in ("input_ids_a", "input_ids_b", "batch_input_ids", "batch_attention_mask")}
    logits = forward_logits(model, inputs)
    mask = ref["batch_attention_mask"].bool()
    diffs = {
        "logits_a": float((logits["logits_a"] - ref["logits_a"]).abs().max()),
        "logits_b": float((logits["logits_b"] - ref["logits_b"]).abs().max()),
        "batch_logits": float((logits["batch_logits"][mask] - ref["batch_logits"][mask]).abs().max()),
    }
    ok = all(v <= CHECK_SAVED_TOL for v in diffs.values()) and not missing and not mismatched
    report = {"src": str(src_dir), "saved": str(saved_dir), "max_abs_diff": diffs, "tol": CHECK_SAVED_TOL}
    if missing or mismatched:
        report["missing_keys"] = missing
        report["mismatched_keys"] = mismatched
    print(json.dumps(report))
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-saved", nargs=2, metavar=("SRC_DIR", "SAVED_DIR"), type=Path)
    ap.add_argument("--only", choices=["tokenizers", "chat", "models"], action="append")
    ap.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help="with --only models: build just these model fixtures (the others are verified)",
    )
    args = ap.parse_args()
    if args.check_saved:
        return check_saved(*args.check_saved)
    torch.set_num_threads(1)  # determinism of float reductions across runs
    torch.use_deterministic_algorithms(True)
    only = set(args.only or ["tokenizers", "chat", "models"])
    tokenizer_dirs = {s.name: FIXTURES / "tokenizers" / s.name for s in TOKENIZER_SPECS}
    if "tokenizers" in only:
        for spec in TOKENIZER_SPECS:
            build_tokenizer(spec)
    if "chat" in only:
        build_chat_reference(tokenizer_dirs)
    if "models" in only:
        chosen = set(args.model or [s.name for s in MODEL_SPECS])
        unknown = chosen - {s.name for s in MODEL_SPECS}
        if unknown:
            raise SystemExit(f"unknown model fixtures: {sorted(unknown)}")
        for spec in MODEL_SPECS:
            if spec.name in chosen:
                build_model(spec, tokenizer_dirs)
        for src, dst in CONVERTED_COPIES.items():
            if src in chosen:
                build_converted_copy(FIXTURES / "models" / src, dst)
        verify_all_models()
    return 0


if __name__ == "__main__":
    sys.exit(main())
