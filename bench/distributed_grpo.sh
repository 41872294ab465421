#!/usr/bin/env bash
# Distributed GRPO benchmark (issue 18): the same run with rollout in process, on 1 remote
# `stoke serve` and on 2, on SmolLM2-135M-Instruct (bench/convert_smollm2.py writes
# $SCRATCH/smollm2/hf; python3 bench/make_arith_tasks.py $SCRATCH/grpo19/tasks.jsonl writes the tasks).
# The settings are bench/grpo-smollm2.toml's (4 prompts x 8 samples, 64 new tokens, token-mean
# loss, AdamW 1e-5) in f32. Every server runs on this machine, so the processes share its cores:
# the figures show where a step's time goes (rollout, trainer, weight publication, each
# server's utilization) for projecting onto machines of their own, not a speed-up on 2 cores.
#
#   bash bench/distributed_grpo.sh [STEPS] [MODE]      # defaults: 4 sync
#
# Prints one line per configuration: median step wall (steps 2..), its rollout / trainer /
# publish seconds, samples/s, and each server's utilization.
set -euo pipefail
STEPS=${1:-4}
MODE=${2:-sync}
STOKE=${STOKE:-target/release/stoke}
OUT=${OUT:-${TMPDIR:-/tmp}/grpo18}
MODEL=${MODEL:-${SCRATCH:-scratch}/smollm2/hf}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
common=(--set "grpo.steps=$STEPS" --set 'grpo.precision="f32"'
        --set 'grpo.activation_checkpointing=false' --set "grpo.mode=\"$MODE\""
        --set "grpo.max_off_policy_steps=$([ "$MODE" = sync ] && echo 0 || echo 1)"
        --set "grpo.threads=$THREADS" --set "model.path=\"$MODEL\"" --quiet)

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

start_server() { # PORT THREADS
    RAYON_NUM_THREADS=$2 "$STOKE" serve --model "$MODEL" --port "$1" --served-model-name policy \
        --kv-cache-gib 1 >"$OUT/serve-$1.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "server on $1 did not start" >&2; exit 1
}

summary() { # NAME
    python3 - "$OUT/$1/metrics.jsonl" "$1" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"step"' in l]
body = steps[1:] or steps
med = lambda f: statistics.median(f(s) for s in body)
wall = med(lambda s: s["seconds"]["rollout"] + s["seconds"]["trainer"] + s["seconds"]["waiting"] + s["seconds"]["reward"])
line = (f"{sys.argv[2]:<10} step wall {med(lambda s: s['samples'] / s['samples_per_s']):6.2f} s | "
        f"rollout {med(lambda s: s['seconds']['rollout']):6.2f} s  trainer {med(lambda s: s['seconds']['trainer']):6.2f} s  "
        f"publish {med(lambda s: s['seconds'].get('publish', 0.0)):5.2f} s  waiting {med(lambda s: s['seconds']['waiting']):6.2f} s | "
        f"{med(lambda s: s['samples_per_s']):5.2f} samples/s")
servers = (steps[-1].get("rollout_servers") or {}).get("servers", [])
for s in servers:
    line += f" | {s['url'].rsplit(':', 1)[1]}: util {s['utilization']:.2f}, {s['throughput']:.0f} tok/s busy"
print(line)
PY
}

"$STOKE" grpo bench/grpo-smollm2.toml "${common[@]}" --set "out.dir=\"$OUT/local\""
summary local

start_server 18101 "$THREADS"
"$STOKE" grpo bench/grpo-smollm2.toml "${common[@]}" --set "out.dir=\"$OUT/remote1\"" \
    --set 'rollout.kind="remote"' --set 'rollout.servers=["http://127.0.0.1:18101"]' \
    --set "rollout.weights_dir=\"$OUT/weights1\""
summary remote1
cleanup; pids=()

start_server 18101 1
start_server 18102 1
"$STOKE" grpo bench/grpo-smollm2.toml "${common[@]}" --set "out.dir=\"$OUT/remote2\"" \
    --set 'rollout.kind="remote"' \
    --set 'rollout.servers=["http://127.0.0.1:18101", "http://127.0.0.1:18102"]' \
    --set "rollout.weights_dir=\"$OUT/weights2\""
summary remote2
