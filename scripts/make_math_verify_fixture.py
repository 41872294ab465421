#!/usr/bin/env python3
"""Turns Math-Verify's own test tables into a JSONL fixture for stoke's math verifier.

Pinned reference: huggingface/Math-Verify 0.8.0 (git 5d148cf), with latex2sympy2_extended 1.10.2
and sympy 1.14.0 (`pip install math-verify==0.8.0`). The script reads the `tests/*.py` files of a
checkout with `ast` (no test code is executed or copied), takes every `pytest.mark.parametrize`
table of (gold, prediction, expected[, extra config]) whose test calls `compare_strings` or
`verify(parse(gold), parse(pred))`, and keeps the test's configuration (`match_types`,
`precision`, `strict`, `allow_set_relation_comp`). It then runs the real Math-Verify twice:
under the test's configuration (`mv_test_config`, which should reproduce the expectation) and
under default settings (`verify(parse(gold), parse(pred))`, `mv_default`). A case "holds under
default settings" when `mv_default == expected`; the acceptance bar applies to those.

Usage: python scripts/make_math_verify_fixture.py MATH_VERIFY_TESTS_DIR OUT.jsonl
"""

import ast
import json
import math
import sys
from pathlib import Path

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# Test functions whose tables are not (gold, prediction, verdict) rows.
SKIPPED = {"test_string_extraction.py": {"test_string_extraction"}}


def table_values(node):
    """The parametrize table's value. Rows are literals except a few f-strings over `math`
    (`f"{math.sqrt(17):.15f}"`), which are evaluated with only `math` in scope."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        code = compile(ast.Expression(node), "<table>", "eval")
        return eval(code, {"__builtins__": {}, "math": math})


def literal_kwargs(call):
    out = {}
    for keyword in call.keywords:
        try:
            out[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            out[keyword.arg] = ast.unparse(keyword.value)
    return out


def test_config(function):
    """The configuration a test passes to `compare_strings` (or None for plain parse/verify)."""
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "compare_strings":
            config = {"match_types": ["latex", "expr"], "precision": 6, "strict": True,
                      "allow_set_relation_comp": False, "harness": "compare_strings"}
            for key, value in literal_kwargs(node).items():
                config[key] = value
            return config
    return {"harness": "parse_verify_default"}


def rows(path):
    tree = ast.parse(path.read_text())
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef):
            continue
        if function.name in SKIPPED.get(path.name, set()):
            continue
        for decorator in function.decorator_list:
            if not (isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("parametrize")):
                continue
            names = [n.strip() for n in ast.literal_eval(decorator.args[0]).split(",")]
            table = table_values(decorator.args[1])
            config = test_config(function)
            for index, values in enumerate(table):
                row = dict(zip(names, values))
                expected = row.get("expected", row.get("result"))
                case_config = dict(config)
                for key in ("precision", "strict", "allow_set_relation_comp"):
                    if key in row:
                        case_config[key] = row[key]
                yield {
                    "source": f"{path.name}::{function.name}[{index}]",
                    "gold": row["gold"],
                    "prediction": row["pred"],
                    "expected": bool(expected),
                    "config": case_config,
                }


def run_test_config(case):
    config = case["config"]
    if config["harness"] != "compare_strings":
        return run_default(case)
    targets = []
    for match_type in config["match_types"]:
        if match_type == "latex":
            targets.append(LatexExtractionConfig(boxed_match_priority=0))
        elif match_type == "expr":
            targets.append(ExprExtractionConfig())
    gold = parse(case["gold"], targets)
    pred = parse(case["prediction"], targets)
    return bool(verify(gold, pred, float_rounding=config["precision"], strict=config["strict"],
                       allow_set_relation_comp=config["allow_set_relation_comp"]))


def run_default(case):
    return bool(verify(parse(case["gold"]), parse(case["prediction"])))


def main():
    tests_dir, out_path = Path(sys.argv[1]), Path(sys.argv[2])
    cases = [case for path in sorted(tests_dir.glob("test_*.py")) for case in rows(path)]
    holding = 0
    with out_path.open("w") as out:
        for case in cases:
            case["mv_test_config"] = run_test_config(case)
            case["mv_default"] = run_default(case)
            case["holds_under_default"] = case["mv_default"] == case["expected"]
            holding += case["holds_under_default"]
            out.write(json.dumps(case, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases, {holding} hold under default settings", file=sys.stderr)


if __name__ == "__main__":
    main()
