#!/usr/bin/env python3
"""The stoke half's numbers in the TRL script's terms, from a `stoke grpo` run's metrics.jsonl:
seconds per update (differences of `elapsed_s`; the first `--warmup` updates are left out), episodes per
second, the share of update time inside tools and inside the environment (`episodes.tool_seconds`,
`episodes.env_seconds`: summed over episodes, so concurrent episodes can add up to more than the wall),
rollout / trainer seconds, turns and tool calls per episode, peak RSS. Prints one JSON line.

    python3 summarize_stoke.py $SCRATCH/trl_multiturn/stoke/metrics.jsonl [--warmup 1] [--out stoke.json]
"""

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics", type=Path)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    steps = [json.loads(l) for l in args.metrics.read_text().splitlines() if l.strip()]
    steps = [s for s in steps if "elapsed_s" in s and "episodes" in s]
    if len(steps) <= args.warmup:
        raise SystemExit(f"{args.metrics}: {len(steps)} updates, none after the {args.warmup} warm-up")
    previous = 0.0
    per_step = []
    for s in steps:
        episodes = s["episodes"] or {}
        per_step.append({
            "step": s["step"],
            "warmup": s["step"] <= args.warmup,
            "seconds": s["elapsed_s"] - previous,
            "rollout_seconds": s["seconds"].get("rollout"),
            "trainer_seconds": s["seconds"].get("trainer"),
            "publish_seconds": s["seconds"].get("publish"),
            "samples": s["samples"],
            "model_tokens": episodes.get("model_tokens"),
            "env_tokens": episodes.get("env_tokens"),
            "turns_mean": episodes.get("turns_mean"),
            "tool_calls_mean": episodes.get("tool_calls_mean"),
            "tool_failures": episodes.get("tool_failures"),
            "stops": episodes.get("stops"),
            "tool_seconds": episodes.get("tool_seconds", 0.0),
            "env_seconds": episodes.get("env_seconds", 0.0),
            "reward_mean": s.get("reward_mean"),
            "peak_rss_bytes": (s.get("memory") or {}).get("peak_rss_bytes"),
        })
        previous = s["elapsed_s"]
    timed = [p for p in per_step if not p["warmup"]]
    wall = sum(p["seconds"] for p in timed)
    episodes = sum(p["samples"] for p in timed)
    result = {
        "tool": "stoke grpo [environment] calculator",
        "metrics": str(args.metrics),
        "warmup_steps": args.warmup,
        "timed_steps": len(timed),
        "seconds_per_step_mean": wall / len(timed),
        "seconds_per_step_median": sorted(p["seconds"] for p in timed)[len(timed) // 2],
        "episodes_per_second": episodes / wall,
        "tool_share_of_step_time": sum(p["tool_seconds"] for p in timed) / wall,
        "env_share_of_step_time": sum(p["env_seconds"] for p in timed) / wall,
        "rollout_share_of_step_time": sum(p["rollout_seconds"] or 0 for p in timed) / wall,
        "tool_calls_per_episode": sum(p["tool_calls_mean"] * p["samples"] for p in timed) / episodes,
        "turns_per_episode": sum(p["turns_mean"] * p["samples"] for p in timed) / episodes,
        "peak_rss_bytes": max(p["peak_rss_bytes"] or 0 for p in per_step),
        "per_step": per_step,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
