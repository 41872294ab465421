#!/usr/bin/env python3
"""Peer for `stoke convert MODEL.gguf OUT_DIR`: transformers' own GGUF loading, written out as a
Hugging Face folder (float32 safetensors, config, tokenizer). A model loaded from GGUF refuses
`save_pretrained`, so the state dict is saved with safetensors, as bench/convert_smollm2.py does.

Usage: $VENV/bin/python bench/gguf_convert_hf.py FILE.gguf OUT_DIR
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf = Path(sys.argv[1])
out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight" or not model.config.tie_word_embeddings}
save_file(state, out / "model.safetensors", metadata={"format": "pt"})
model.config.save_pretrained(out)
tokenizer.save_pretrained(out)
