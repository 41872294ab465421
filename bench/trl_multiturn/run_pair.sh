#!/bin/bash
# Back-to-back pairs of the issue-51 benchmark: one `stoke grpo` run and one TRL run per pair,
# the order alternating (stoke first in odd pairs), each 1 warm-up + STEPS timed updates.
# Run from the repository root:
#   SCRATCH=scratch VENV=/path/to/venv PAIRS=2 STEPS=4 bash bench/trl_multiturn/run_pair.sh
# MODEL (default $SCRATCH/smollm2/hf, or the SFT'd $SCRATCH/trl_multiturn/sft/model) is used by both.
# Writes $SCRATCH/trl_multiturn/pair-N/{stoke.json,trl.json,*.time} and prints one line per run.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SCRATCH=${SCRATCH:-scratch}
VENV=${VENV:?set VENV to the venv with torch, transformers, trl}
STOKE=${STOKE:-target/release/stoke}
MODEL=${MODEL:-$SCRATCH/smollm2/hf}
PAIRS=${PAIRS:-2}
STEPS=${STEPS:-4}
OUT=$SCRATCH/trl_multiturn
TASKS=$OUT/tasks.jsonl
mkdir -p "$OUT"
MODEL=$(realpath "$MODEL"); TASKS=$(realpath -m "$TASKS"); OUT=$(realpath "$OUT")

if [ ! -s "$TASKS" ]; then   # stoke's calculator tasks (digits 3, seed 1), 64 of them, with prompt ids
  "$STOKE" env --model "$MODEL" --digits 3 --task-seed 1 --tasks 64 --max-turns 1 \
    --max-turn-tokens 1 --format json > "$OUT/stoke_env.jsonl"
  "$VENV/bin/python" "$HERE/trl_multiturn_grpo.py" --make-tasks "$OUT/stoke_env.jsonl" --tasks "$TASKS"
fi

run_stoke() {
  rm -rf "$1/stoke"
  /usr/bin/time -v -o "$1/stoke.time" "$STOKE" grpo "$HERE/stoke-calculator-smollm2.toml" --quiet \
    --set "model.path=$MODEL" --set "tasks.path=$TASKS" --set "output_dir=$1/stoke" \
    --set "training.steps=$((STEPS + 1))" > "$1/stoke.log" 2>&1
  python3 "$HERE/summarize_stoke.py" "$1/stoke/metrics.jsonl" --warmup 1 --out "$1/stoke.json" > /dev/null
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('stoke', sys.argv[1], round(r['seconds_per_step_mean'],2), 's/step', round(r['episodes_per_second'],3), 'episodes/s', 'tools', round(100*r['tool_share_of_step_time'],3), '%')" "$1/stoke.json"
}
run_trl() {
  /usr/bin/time -v -o "$1/trl.time" "$VENV/bin/python" "$HERE/trl_multiturn_grpo.py" --model "$MODEL" \
    --tasks "$TASKS" --warmup-steps 1 --steps "$STEPS" --work-dir "$1/trl-work" --out "$1/trl.json" \
    > "$1/trl.log" 2>&1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('trl', sys.argv[1], round(r['seconds_per_step_mean'],2), 's/step', round(r['episodes_per_second'],3), 'episodes/s', 'tools', round(100*r['tool_share_of_step_time'],3), '%')" "$1/trl.json"
}
for pair in $(seq 1 "$PAIRS"); do
  dir=$OUT/pair-$pair; mkdir -p "$dir"; uptime > "$dir/uptime"
  if [ $((pair % 2)) -eq 1 ]; then run_stoke "$dir"; run_trl "$dir"; else run_trl "$dir"; run_stoke "$dir"; fi
  uptime >> "$dir/uptime"
done
