#!/usr/bin/env bash
# Starts one server, runs bench/serve_load.py's workloads against it one after another (lowest
# concurrency first; the load `micro` runs bench/serve_micro.py's single requests), prints one
# JSON line per workload with the server's peak resident memory
# so far (VmHWM summed over the server's processes: vLLM runs an API server, an engine core and
# a worker), and stops the server. By hand, never in CI.
#
#   bench/serve_compare.sh NAME PORT 'SERVER COMMAND' 'CLIENTS:REQUESTS ...' [LOAD ARGS...]
#
# e.g.
#   bench/serve_compare.sh stoke-f32 8011 \
#     'target/release/stoke serve --model $SCRATCH/smollm2/hf --served-model-name smollm2 --port 8011' \
#     '1:8 4:16 64:128' --no-seed
#   bench/serve_compare.sh vllm 8012 \
#     'env LD_PRELOAD=$VLLM_VENV/lib/libiomp5.so VLLM_CPU_KVCACHE_SPACE=4 $VLLM_VENV/bin/python -m vllm.entrypoints.openai.api_server --model $SCRATCH/smollm2/hf --served-model-name smollm2 --max-model-len 2048 --host 127.0.0.1 --port 8012' \
#     '1:8 4:16 64:128' --no-seed
set -euo pipefail
name=$1 port=$2 command=$3 loads=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
log=${TMPDIR:-/tmp}/serve_compare_$name.log
setsid bash -c "exec $command" >"$log" 2>&1 &
leader=$!
trap 'kill -INT -- -$leader 2>/dev/null || true; sleep 2; kill -KILL -- -$leader 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
  sleep 1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "$name did not start; see $log"; exit 1; }
# One warm-up request (vLLM compiles on first use).
python3 "$here/serve_load.py" --url "http://127.0.0.1:$port" --model smollm2 --clients 1 --requests 1 --no-seed >/dev/null
for load in $loads; do
  if [ "$load" = micro ]; then
    python3 "$here/serve_micro.py" --url "http://127.0.0.1:$port" --model smollm2 \
      | python3 -c "import json, sys; r = json.load(sys.stdin); r['server'] = '$name'; print(json.dumps(r))"
    continue
  fi
  clients=${load%%:*} requests=${load##*:}
  out=${TMPDIR:-/tmp}/serve_compare_${name}_c$clients.json
  python3 "$here/serve_load.py" --url "http://127.0.0.1:$port" --model smollm2 \
    --clients "$clients" --requests "$requests" "$@" > "$out"
  peak_kb=0
  for pid in $(pgrep -g "$leader"); do
    kb=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    peak_kb=$((peak_kb + ${kb:-0}))
  done
  python3 - "$name" "$peak_kb" "$out" <<'EOF'
import json, sys
name, peak_kb, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
result = json.load(open(path))
result["server"] = name
result["peak_rss_mib"] = round(peak_kb / 1024)
print(json.dumps(result))
EOF
done
