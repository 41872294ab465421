#!/usr/bin/env python3
"""PEFT fixtures for stoke's LoRA loader (crates/model/tests/lora.rs): adapters made by `peft` on
tiny fixture checkpoints, with the adapted and merged models' logits computed by transformers+peft.

Run by hand, once (CI never runs Python ML packages; the outputs are committed):

    $VENV/bin/pip install peft==0.21.2   # plus scripts/requirements-fixtures.txt
    $VENV/bin/python scripts/make_peft_fixture.py

Writes fixtures/peft/<name>/: adapter_model.safetensors and adapter_config.json exactly as
`PeftModel.save_pretrained` writes them, and reference.safetensors with `input_ids` [2, 9] (i64),
`logits` (the adapted model, f32) and `merged_logits` (after `merge_and_unload`). The adapter
weights are not PEFT's init (B = 0 would make the adapter invisible): after `get_peft_model`
every lora_A and lora_B is redrawn from N(0, 0.3^2) with a fixed seed.
"""

import json
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
PEFT_VERSION = "0.21.2"

CASES = [
    # name, base fixture, LoraConfig kwargs
    (
        "qwen2_bias_tied_qvod",
        "qwen2_bias_tied",
        dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]),
    ),
    (
        "llama_gqa_all_linear_rslora",
        "llama_gqa_rope_llama3",
        dict(r=3, lora_alpha=5, target_modules="all-linear", use_rslora=True),
    ),
]


def main():
    if peft.__version__ != PEFT_VERSION:
        print(f"warning: peft {peft.__version__}, the fixtures were made with {PEFT_VERSION}")
    torch.manual_seed(0)
    for name, base, kwargs in CASES:
        model = AutoModelForCausalLM.from_pretrained(ROOT / "fixtures/models" / base, dtype=torch.float32)
        model.eval()
        vocab = model.config.vocab_size
        input_ids = torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            base_logits = model(input_ids=input_ids).logits.float()
        config = LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **kwargs)
        peft_model = get_peft_model(model, config)
        with torch.no_grad():
            for pname, p in peft_model.named_parameters():
                if "lora_" in pname:
                    p.copy_(torch.randn_like(p) * 0.3)
        out = ROOT / "fixtures/peft" / name
        out.mkdir(parents=True, exist_ok=True)
        peft_model.save_pretrained(out)
        # Keep the fixture small and machine-independent: no model card, a relative base path.
        (out / "README.md").unlink(missing_ok=True)
        config_path = out / "adapter_config.json"
        adapter_config = json.loads(config_path.read_text())
        adapter_config["base_model_name_or_path"] = f"fixtures/models/{base}"
        config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
        with torch.no_grad():
            logits = peft_model(input_ids=input_ids).logits.float()
            merged = peft_model.merge_and_unload()
            merged_logits = merged(input_ids=input_ids).logits.float()
        save_file(
            {
                "input_ids": input_ids.contiguous(),
                "logits": logits.contiguous(),
                "merged_logits": merged_logits.contiguous(),
            },
            out / "reference.safetensors",
        )
        (out / "reference.json").write_text(
            json.dumps(
                {
                    "base": f"fixtures/models/{base}",
                    "peft": peft.__version__,
                    "transformers": transformers.__version__,
                    "torch": torch.__version__,
                    "lora_config": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in kwargs.items()},
                    "max_abs_logit_change_from_base": float((logits - base_logits).abs().max()),
                },
                indent=2,
            )
            + "\n"
        )
        print(name, "written", out)


if __name__ == "__main__":
    main()
