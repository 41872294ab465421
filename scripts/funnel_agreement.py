#!/usr/bin/env python3
"""Compares stoke's funnel filters with datatrove's, document by document.

Input: a JSONL file in the format written by scripts/make_funnel_agreement_fixture.py, one line
per document: {"id", "text", "datatrove": {FILTER: {"keep", "reason", "numbers"}}} with FILTER in
gopher_quality, gopher_repetition, c4, fineweb. A plain JSONL of {"id", "text"} also works: the
datatrove side is then computed first, as the fixture script does (this needs the pinned
datatrove venv, see that script's docstring; a file that already carries datatrove's results
needs nothing beyond the standard library).

The stoke side comes from

    STOKE data verdicts --input IN.jsonl --output OUT.jsonl

(IN.jsonl holds {"id", "text"} per document; OUT.jsonl one JSON line per input document, in
order: {"id", FILTER: {"keep", "reason", "numbers"}, ...}, reasons spelled as datatrove's), or from
a file already written by it (--stoke-output).

For each filter the report gives the keep/drop agreement, the counts of each disagreement
direction (datatrove keeps / stoke drops and the reverse; both drop for different reasons), and
lists every disagreement with both verdicts and reasons, both sides' numbers for the rules whose
values differ (|a - b| > 1e-9, or null on one side only, or a key stoke lacks), and a short
excerpt of the text. It also counts, per rule number, the documents where the two sides' numbers
differ even though the verdicts agree (with a few example ids), since such differences are the
ones that will flip verdicts on other documents.

Usage:

    python3 scripts/funnel_agreement.py crates/data/tests/fixtures/datatrove_agreement.jsonl
    python3 scripts/funnel_agreement.py $SCRATCH/funnel-agreement/large.jsonl --stoke target/release/stoke \\
        --json $SCRATCH/funnel-agreement/report.json
    python3 scripts/funnel_agreement.py docs.jsonl --stoke-output stoke_verdicts.jsonl   # no run
    $DATATROVE_VENV/bin/python scripts/funnel_agreement.py plain_id_text.jsonl             # runs datatrove

Exit status: 0; 1 when --fail-under is given and some filter's verdict agreement is below it;
2 on malformed input or a failed stoke run.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

FILTERS = ("gopher_quality", "gopher_repetition", "c4", "fineweb")
TOLERANCE = 1e-9


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_jsonl(path):
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                die(f"{path}:{n}: not JSON ({e})")
    return rows


def with_datatrove(rows):
    """Adds datatrove's results to rows that lack them (imports the fixture script's code)."""
    missing = [r for r in rows if "datatrove" not in r]
    if not missing:
        return rows
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import make_funnel_agreement_fixture as fixture
    except ImportError as e:
        die(f"cannot import make_funnel_agreement_fixture ({e})")
    try:
        fixture.check_versions()
        print(f"running datatrove on {len(missing)} documents ...", file=sys.stderr)
        for r in missing:
            r["datatrove"] = fixture.datatrove_results(r["text"])
    except ImportError as e:
        die(f"datatrove is needed for input without datatrove results: {e}")
    return rows


def run_stoke(stoke, rows, workdir):
    inp = Path(workdir) / "input.jsonl"
    out = Path(workdir) / "stoke_verdicts.jsonl"
    with open(inp, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps({"id": r["id"], "text": r["text"]}, ensure_ascii=False) + "\n")
    cmd = [stoke, "data", "verdicts", "--input", str(inp), "--output", str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        die(f"cannot run {stoke}: {e}")
    if proc.returncode != 0:
        die(f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
    if not out.exists():
        die(f"{' '.join(cmd)} wrote no {out}")
    return read_jsonl(out)


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def number_diffs(dt_nums, st_nums):
    """{key: {"datatrove": a, "stoke": b}} for every datatrove key whose values differ."""
    diffs = {}
    for key, a in dt_nums.items():
        if key not in st_nums:
            diffs[key] = {"datatrove": a, "stoke": "<missing>"}
            continue
        b = st_nums[key]
        if a is None and b is None:
            continue
        if is_num(a) and is_num(b):
            if abs(a - b) <= TOLERANCE:
                continue
        elif a == b:
            continue
        diffs[key] = {"datatrove": a, "stoke": b}
    return diffs


def excerpt(text, n):
    text = text if len(text) <= n else text[:n] + "…"
    return json.dumps(text, ensure_ascii=False)


def compare(rows, stoke_rows, excerpt_chars, examples):
    if len(stoke_rows) != len(rows):
        die(f"stoke wrote {len(stoke_rows)} lines for {len(rows)} documents")
    for i, (r, s) in enumerate(zip(rows, stoke_rows)):
        if s.get("id") != r["id"]:
            die(f"line {i + 1}: stoke's id {s.get('id')!r} is not the input's {r['id']!r}")
    report = {"documents": len(rows), "filters": {}}
    for name in FILTERS:
        counts = {"both_keep": 0, "both_drop_same_reason": 0, "both_drop_other_reason": 0,
                  "datatrove_keeps_stoke_drops": 0, "datatrove_drops_stoke_keeps": 0}
        disagreements = []
        number_mismatch = {}  # key -> {"documents": n, "examples": [...]} (verdicts agree)
        extra_keys = set()
        for r, s in zip(rows, stoke_rows):
            d = r["datatrove"][name]
            if name not in s:
                die(f"{r['id']}: stoke's line has no {name!r}")
            st = s[name]
            dk, sk = bool(d["keep"]), bool(st.get("keep"))
            dr, sr = d.get("reason"), st.get("reason")
            if dk and sk:
                kind = "both_keep"
            elif not dk and not sk:
                kind = "both_drop_same_reason" if dr == sr else "both_drop_other_reason"
            else:
                kind = "datatrove_keeps_stoke_drops" if dk else "datatrove_drops_stoke_keeps"
            counts[kind] += 1
            st_nums = st.get("numbers") or {}
            extra_keys.update(set(st_nums) - set(d["numbers"]))
            diffs = number_diffs(d["numbers"], st_nums)
            if kind in ("both_keep", "both_drop_same_reason"):
                for key, v in diffs.items():
                    m = number_mismatch.setdefault(key, {"documents": 0, "examples": []})
                    m["documents"] += 1
                    if len(m["examples"]) < examples:
                        m["examples"].append({"id": r["id"], **v})
                continue
            disagreements.append({
                "id": r["id"],
                "kind": kind,
                "datatrove": {"keep": dk, "reason": dr},
                "stoke": {"keep": sk, "reason": sr},
                "numbers": diffs,
                "excerpt": excerpt(r["text"], excerpt_chars),
            })
        n = len(rows)
        agree = counts["both_keep"] + counts["both_drop_same_reason"] + counts["both_drop_other_reason"]
        report["filters"][name] = {
            "verdict_agreement_pct": 100.0 * agree / n if n else 100.0,
            "reason_agreement_pct": 100.0 * (counts["both_keep"] + counts["both_drop_same_reason"]) / n if n else 100.0,
            "datatrove_keep_rate_pct": 100.0 * sum(r["datatrove"][name]["keep"] for r in rows) / n if n else 0.0,
            "stoke_keep_rate_pct": 100.0 * sum(bool(s[name].get("keep")) for s in stoke_rows) / n if n else 0.0,
            "counts": counts,
            "disagreements": disagreements,
            "number_mismatches_when_verdicts_agree": dict(sorted(number_mismatch.items())),
            "stoke_only_number_keys": sorted(extra_keys),
        }
    return report


def fmt(v):
    if isinstance(v, float):
        return f"{v:.10g}"
    return json.dumps(v, ensure_ascii=False)


def print_report(report, max_list):
    print(f"{report['documents']} documents")
    for name, f in report["filters"].items():
        c = f["counts"]
        print(f"\n== {name}: verdicts agree {f['verdict_agreement_pct']:.2f}%, reasons agree {f['reason_agreement_pct']:.2f}% "
              f"(keep rate: datatrove {f['datatrove_keep_rate_pct']:.1f}%, stoke {f['stoke_keep_rate_pct']:.1f}%)")
        print(f"   both keep {c['both_keep']}, both drop {c['both_drop_same_reason']} (+{c['both_drop_other_reason']} for another reason), "
              f"datatrove keeps/stoke drops {c['datatrove_keeps_stoke_drops']}, datatrove drops/stoke keeps {c['datatrove_drops_stoke_keeps']}")
        if f["stoke_only_number_keys"]:
            print(f"   numbers only stoke reports: {', '.join(f['stoke_only_number_keys'])}")
        shown = f["disagreements"] if max_list < 0 else f["disagreements"][:max_list]
        for d in shown:
            print(f"   - {d['id']} [{d['kind']}] datatrove: {'keep' if d['datatrove']['keep'] else 'drop'} ({d['datatrove']['reason']}), "
                  f"stoke: {'keep' if d['stoke']['keep'] else 'drop'} ({d['stoke']['reason']})")
            for key, v in d["numbers"].items():
                print(f"       {key}: datatrove {fmt(v['datatrove'])}  stoke {fmt(v['stoke'])}")
            print(f"       text: {d['excerpt']}")
        if len(shown) < len(f["disagreements"]):
            print(f"   ... {len(f['disagreements']) - len(shown)} more (see --json, or --max-list -1)")
        mm = f["number_mismatches_when_verdicts_agree"]
        if mm:
            print("   numbers that differ although the verdicts agree:")
            for key, m in mm.items():
                ex = ", ".join(f"{e['id']} ({fmt(e['datatrove'])} vs {fmt(e['stoke'])})" for e in m["examples"])
                print(f"       {key}: {m['documents']} documents, e.g. {ex}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="JSONL with datatrove results (fixture format) or plain {id, text}")
    ap.add_argument("--stoke", default="target/release/stoke", help="stoke binary (default: %(default)s)")
    ap.add_argument("--stoke-output", help="use this `stoke data verdicts` output instead of running stoke")
    ap.add_argument("--json", help="write the full report as JSON here")
    ap.add_argument("--keep-work", help="directory for stoke's input/output files (default: a temporary one)")
    ap.add_argument("--max-list", type=int, default=50, help="disagreements printed per filter (-1: all; default %(default)s)")
    ap.add_argument("--excerpt", type=int, default=160, help="characters of text shown per disagreement")
    ap.add_argument("--examples", type=int, default=3, help="example ids per differing number")
    ap.add_argument("--fail-under", type=float, help="exit 1 if some filter's verdict agreement (%%) is below this")
    args = ap.parse_args()

    rows = read_jsonl(args.input)
    for i, r in enumerate(rows):
        if "id" not in r or "text" not in r:
            die(f"{args.input}: line {i + 1} lacks id or text")
    rows = with_datatrove(rows)

    if args.stoke_output:
        stoke_rows = read_jsonl(args.stoke_output)
    elif args.keep_work:
        Path(args.keep_work).mkdir(parents=True, exist_ok=True)
        stoke_rows = run_stoke(args.stoke, rows, args.keep_work)
    else:
        with tempfile.TemporaryDirectory(prefix="funnel-agreement-") as tmp:
            stoke_rows = run_stoke(args.stoke, rows, tmp)

    report = compare(rows, stoke_rows, args.excerpt, args.examples)
    report["input"] = str(args.input)
    print_report(report, args.max_list)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, ensure_ascii=False, indent=1)
    if args.fail_under is not None:
        worst = min(f["verdict_agreement_pct"] for f in report["filters"].values())
        if worst < args.fail_under:
            print(f"\nverdict agreement {worst:.2f}% is below {args.fail_under}%", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
