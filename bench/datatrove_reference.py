"""datatrove reference for `cargo run --release -p stoke-data --example bench_funnel`.

Runs datatrove's equivalent of stoke's `datatrove_equivalent` funnel (Gopher repetition, Gopher
quality, C4, FineWeb quality, PII formatter for emails and IPs; datatrove defaults, same order) on
the same corpus, on one process (one core), and prints documents/s, MB/s of text and the number
of kept documents (compare with stoke's kept count: the filters should agree closely).

Setup (outside the repository):
    python3 -m venv $DATATROVE_VENV && $DATATROVE_VENV/bin/pip install datatrove==0.10.1 spacy==3.8.18 orjson
Run:
    $DATATROVE_VENV/bin/python bench/datatrove_reference.py $SCRATCH/stoke-bench/corpus.jsonl [--limit N]

The language filter is left out on both sides of the ratio: datatrove's needs the fastText
lid.176 model download, which this machine cannot reach.
"""

import argparse
import json
import os
import shutil
import tempfile
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("corpus", help="JSONL corpus written by bench_funnel")
    parser.add_argument("--limit", type=int, default=-1, help="documents to read (-1: all)")
    args = parser.parse_args()

    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.pipeline.formatters import PIIFormatter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    docs = 0
    text_bytes = 0
    with open(args.corpus, encoding="utf-8") as f:
        for line in f:
            if args.limit >= 0 and docs >= args.limit:
                break
            text_bytes += len(json.loads(line)["text"].encode("utf-8"))
            docs += 1

    work = tempfile.mkdtemp(prefix="dt-bench-")
    folder, name = os.path.split(os.path.abspath(args.corpus))
    pipeline = [
        JsonlReader(folder, glob_pattern=name, limit=args.limit),
        GopherRepetitionFilter(),
        GopherQualityFilter(),
        C4QualityFilter(),
        FineWebQualityFilter(),
        PIIFormatter(),
        JsonlWriter(os.path.join(work, "out"), compression=None),
    ]
    executor = LocalPipelineExecutor(
        pipeline=pipeline, tasks=1, workers=1, logging_dir=os.path.join(work, "logs")
    )
    start = time.perf_counter()
    cpu_start = time.process_time()
    executor.run()
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start

    kept = 0
    for root, _, files in os.walk(os.path.join(work, "out")):
        for file in files:
            with open(os.path.join(root, file), encoding="utf-8") as f:
                kept += sum(1 for _ in f)
    shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "documents": docs,
                "megabytes": text_bytes / 1e6,
                "kept": kept,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "megabytes_per_cpu_second": text_bytes / 1e6 / cpu_seconds,
                "documents_per_second": docs / seconds,
                "megabytes_per_second": text_bytes / 1e6 / seconds,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
