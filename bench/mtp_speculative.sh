#!/usr/bin/env bash
# Multi-token prediction and self-speculative decoding (issue 16): pretrains
# bench/mtp-speculative's tiny DeepSeek-V3 (one MTP module) with the MTP loss, then generates
# from the same prompt with and without `--speculative`, greedy and sampled, and prints the
# acceptance. Time the two `generate` commands as whole processes for the speed-up.
#
#   cargo build --release && bash bench/mtp_speculative.sh [WORK_DIR]   (default $TMPDIR/mtp-spec)
#   LAYERS=12 STEPS=1200 bash bench/mtp_speculative.sh $SCRATCH/mtp-spec-12  (the deeper variant)
#
# Data: this repository's Markdown and Rust sources, a 1,024-token BPE trained on them, one file
# in twenty held out (as bench/moe_balance.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
STOKE=${STOKE:-$PWD/target/release/stoke}
WORK=${1:-${TMPDIR:-/tmp}/mtp-spec}
mkdir -p "$WORK"
LAYERS=${LAYERS:-4}
STEPS=${STEPS:-1500}
cp bench/mtp-speculative/mtp.toml bench/mtp-speculative/config.json "$WORK/"
sed -i "s/\"num_hidden_layers\": 4,/\"num_hidden_layers\": $LAYERS,/" "$WORK/config.json"
sed -i "s/^steps = 1500$/steps = $STEPS/" "$WORK/mtp.toml"
cat README.md bench/*.md crates/README.md fixtures/README.md crates/*/src/*.rs > "$WORK/corpus.txt"
cd "$WORK"
rm -rf tok shards run part_* eval.txt
"$STOKE" tokenizer train --input corpus.txt --vocab-size 1024 --output tok
split -n l/20 corpus.txt part_
mv part_at eval.txt
"$STOKE" data tokenize --tokenizer tok --input part_* --output shards/train --eos '<|endoftext|>'
"$STOKE" data tokenize --tokenizer tok --input eval.txt --output shards/eval --eos '<|endoftext|>'
"$STOKE" train mtp.toml --quiet
PROMPT='pub fn forward(&self, x: &Tensor) -> Result<Tensor> {'
for temperature in 0 0.7; do
    for mode in "" "--speculative"; do
        echo "== temperature $temperature ${mode:-(plain)}"
        "$STOKE" generate --model run/model --prompt "$PROMPT" --max-tokens 256 \
            --temperature "$temperature" -n 8 --seed 1 $mode --format json > "gen_${temperature}${mode}.jsonl"
    done
done
