#!/usr/bin/env python3
"""By-hand check that a GGUF written by stoke runs in llama.cpp and decodes greedily as stoke does.

Loads GGUF with llama-cpp-python (PyPI llama-cpp-python 0.3.36, built from source), feeds the
prompt token ids given, and prints the greedy continuation's ids as JSON on one line, to compare
with `stoke generate --model SAME.gguf --prompt-ids ... --temperature 0` (bench/README.md, "GGUF").

Usage: $VENV/bin/python bench/gguf_llamacpp.py FILE.gguf --prompt-ids 1,2,3 --max-tokens 32
"""

import argparse
import json

from llama_cpp import Llama


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("gguf")
    parser.add_argument("--prompt-ids", required=True)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt_ids.split(",")]
    llm = Llama(model_path=args.gguf, n_ctx=1024, n_threads=2, verbose=False, logits_all=False)
    out = []
    for token in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
        if token == llm.token_eos() or len(out) >= args.max_tokens:
            break
        out.append(token)
    print(json.dumps({"token_ids": out, "text": llm.detokenize(out).decode("utf-8", "replace"),
                      "llama_tokenize": llm.tokenize(b"Hello world 12345", add_bos=False, special=True)}))


if __name__ == "__main__":
    main()
