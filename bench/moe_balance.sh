#!/usr/bin/env bash
# MoE load balancing (issue 16, "Balancing"): pretrains bench/moe-balance's tiny Qwen3-MoE for
# 600 steps under each `[training.moe] balance` mode on the same data and prints, per mode, the
# max load violation (MaxVio, worst layer) per 100-step window, the experts left with under 0.5%
# of their layer's slots at the end, and the eval loss. Each run's report.html charts the
# violation and every layer's per-expert load.
#
#   cargo build --release && bash bench/moe_balance.sh [WORK_DIR]     (default $TMPDIR/moe-balance)
#
# Data: this repository's Markdown and Rust sources (2.4 MB), a 1,024-token BPE trained on them,
# one file in twenty held out. About 4 minutes per mode on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
STOKE=${STOKE:-$PWD/target/release/stoke}
WORK=${1:-${TMPDIR:-/tmp}/moe-balance}
mkdir -p "$WORK"
cp bench/moe-balance/moe.toml bench/moe-balance/config.json "$WORK/"
cat README.md bench/*.md crates/README.md fixtures/README.md crates/*/src/*.rs > "$WORK/corpus.txt"
cd "$WORK"
rm -rf tok shards runs part_* eval.txt
"$STOKE" tokenizer train --input corpus.txt --vocab-size 1024 --output tok
split -n l/20 corpus.txt part_
mv part_at eval.txt
"$STOKE" data tokenize --tokenizer tok --input part_* --output shards/train --eos '<|endoftext|>'
"$STOKE" data tokenize --tokenizer tok --input eval.txt --output shards/eval --eos '<|endoftext|>'
for mode in none aux_loss aux_free smebu; do
    "$STOKE" train moe.toml --set "output_dir=\"runs/$mode\"" \
        --set "training.moe.balance=\"$mode\"" --quiet
done
python3 - <<'PY'
import json
print("mode      MaxVio per 100 steps (mean of each window)         dead experts  final eval loss")
for mode in ["none", "aux_loss", "aux_free", "smebu"]:
    rows = [json.loads(l) for l in open(f"runs/{mode}/metrics.jsonl")]
    steps = [r for r in rows if r["kind"] == "step"]
    evals = [r for r in rows if r["kind"] == "eval"]
    windows = [steps[i:i + 100] for i in range(0, len(steps), 100)]
    vio = [sum(s["moe"]["max_violation"] for s in w) / len(w) for w in windows]
    dead = sum(sum(1 for f in shares if f < 0.005) for _, shares in steps[-1]["moe"]["expert_load"])
    print(f"{mode:9} " + " ".join(f"{v:5.2f}" for v in vio) + f"   {dead:>6}        {evals[-1]['loss']:.3f}")
PY
