#!/usr/bin/env bash
# Benchmark-quality analysis on the speedrun's own checkpoints (README, "Evaluation"):
# the quick speedrun keeps a checkpoint every 20 steps of pretraining and SFT, every checkpoint
# is evaluated on the built-in lettered multiple-choice task and the arithmetic exact-match task,
# and `stoke eval quality` gives one verdict per task and series, with a report of charts.
#
#   bash scripts/eval_quality_example.sh [WORK_DIR]     (about 3 minutes in a release build)
set -euo pipefail
work=${1:-runs/eval-quality-example}
stoke=${STOKE:-target/release/stoke}
[ -x "$stoke" ] || cargo build --release --locked
"$stoke" speedrun --quick --out "$work/speedrun" --checkpoint-every 20
for stage in pretrain sft; do
    "$stoke" eval run --task arithmetic_mc --task arithmetic \
        --checkpoints "$work/speedrun/$stage/checkpoints" --out "$work/$stage" --progress-every 0
    echo "== $stage checkpoints"
    "$stoke" eval quality --series "$work/$stage/series.json" \
        --out "$work/$stage/quality.json" --report "$work/$stage-quality"
done
