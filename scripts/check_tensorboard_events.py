"""Reads a stoke run's TensorBoard event file with TensorBoard's own loader and checks it against
the run's metrics.jsonl (run by hand; CI checks the format with a Rust round-trip test).

    python -m venv "$VENV" && "$VENV/bin/pip" install tensorboard==2.21.0
    "$VENV/bin/python" scripts/check_tensorboard_events.py RUN_DIR

Every `kind = "step"` record's numeric fields must appear as scalars at that step (tags as
`stoke_train::metrics::scalars` names them; `eval/...` for eval records), with equal values in
float32; the first event must carry the file version. Prints a summary and exits non-zero on any
mismatch.
"""

import json
import math
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader


def flatten(prefix, value, out):
    if isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, (int, float)):
        out[prefix] = float(value)
    elif isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        out[prefix] = float(value.replace("Infinity", "inf"))
    elif isinstance(value, dict):
        for key, inner in value.items():
            flatten(f"{prefix}/{key}", inner, out)


def expected_scalars(record):
    kind = record.get("kind")
    prefix = "" if kind in (None, "step") else f"{kind}/"
    out = {}
    for key, value in record.items():
        if key in ("kind", "step"):
            continue
        flatten(f"{prefix}{key}", value, out)
    return out


def main(run_dir):
    run_dir = Path(run_dir)
    records = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    events = list(LegacyEventFileLoader(str(run_dir / "events.out.tfevents.stoke")).Load())
    if not events or events[0].file_version != "brain.Event:2":
        sys.exit(f"first event has no file version: {events[:1]}")
    # What dashboards read: TensorBoard's own accumulator over the run folder.
    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    seen = {}
    for tag in accumulator.Tags()["scalars"]:
        for scalar in accumulator.Scalars(tag):
            seen[(scalar.step, tag)] = scalar.value
    checked = 0
    for record in records:
        for tag, value in expected_scalars(record).items():
            got = seen.get((record["step"], tag))
            if got is None:
                sys.exit(f"step {record['step']}: no scalar {tag!r} in the event file")
            want = float(__import__("numpy").float32(value))
            if not (got == want or (math.isnan(got) and math.isnan(want))):
                sys.exit(f"step {record['step']} {tag}: event file {got}, metrics.jsonl {want}")
            checked += 1
    print(
        f"{run_dir}: {len(events)} events, {len(records)} records, {checked} scalars agree "
        f"(TensorBoard's EventAccumulator)"
    )


if __name__ == "__main__":
    main(sys.argv[1])
