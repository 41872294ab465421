"""Writes crates/data/src/funnel/spacy_en_tables.rs: the rules of spaCy's English tokenizer and
sentencizer, as datatrove's English word tokenizer calls them (`spacy.blank("en")` plus the
`sentencizer` pipe), and the Unicode character classes datatrove's filters test with Python's
`str` methods, so that stoke's `spacy_en` tokenizer and the funnel filters reproduce datatrove's
word lists without Python.

Run by hand (CI never needs Python), in a venv outside the repository:

    python3.11 -m venv $DATATROVE_VENV
    $DATATROVE_VENV/bin/pip install datatrove==0.10.1 spacy==3.8.18
    $DATATROVE_VENV/bin/python scripts/make_spacy_en_tables.py

What is taken from where:
- prefixes, suffixes and infixes: `nlp.Defaults`, each regex entry recognized by its shape
  (literal, `\\.\\.+`, one character class, look-behind / look-ahead around literals); an entry
  of any other shape stops the script, so a spaCy upgrade cannot go unnoticed;
- every character class is evaluated by Python's `re` over all code points, so spaCy's own class
  syntax (including its quirks, such as `|` and `(` inside `[...]`) decides membership;
- special cases: `nlp.tokenizer.rules` (1,347 in spaCy 3.8.18);
- the URL pattern: `nlp.tokenizer.url_match`, kept as a regex string (`\\w` spelled out as
  Python reads it, `[\\p{L}\\p{N}_]`);
- the sentencizer's punctuation: `Sentencizer.default_punct_chars`;
- Unicode classes from Python 3.11's `unicodedata` (Unicode 14.0): `str.isspace`, `str.isalpha`,
  general category P* (spaCy's `is_punct`), and datatrove's `PUNCTUATION_SET`.
"""

import re
import sys
import unicodedata
from pathlib import Path

import datatrove
import spacy
from datatrove.utils.text import PUNCTUATION_SET
from spacy.attrs import ORTH

PINNED = {"spacy": "3.8.18", "datatrove": "0.10.1", "python": "3.11", "unicode": "14.0.0"}

OUT = Path(__file__).resolve().parent.parent / "crates/data/src/funnel/spacy_en_tables.rs"

ALL_CHARS = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def check_versions():
    found = {
        "spacy": spacy.__version__,
        "datatrove": datatrove.__version__ if hasattr(datatrove, "__version__") else None,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "unicode": unicodedata.unidata_version,
    }
    if found["datatrove"] is None:
        from importlib.metadata import version

        found["datatrove"] = version("datatrove")
    if found != PINNED:
        sys.exit(f"pinned versions {PINNED}, found {found}")


def ranges_of(predicate):
    """Sorted inclusive code-point ranges of the characters the predicate accepts."""
    out = []
    for ch in ALL_CHARS:
        if predicate(ch):
            c = ord(ch)
            if out and out[-1][1] == c - 1:
                out[-1][1] = c
            else:
                out.append([c, c])
    return out


SETS = {}  # name -> ranges


def char_set(class_body):
    """The set a regex character class `[class_body]` matches, under a stable name."""
    name = f"SET_{len(SETS)}"
    for existing, (body, _) in SETS.items():
        if body == class_body:
            return existing
    pattern = re.compile("[" + class_body + "]")
    SETS[name] = (class_body, ranges_of(lambda ch: pattern.fullmatch(ch) is not None))
    return name


def literal(piece):
    """The string a regex piece matches when it is a plain (possibly escaped) literal."""
    if re.search(r"(?<!\\)[\[\]()+*?|^$.{}]", piece):
        return None
    text = re.sub(r"\\(.)", r"\1", piece)
    return text if re.fullmatch(piece, text) else None


LOOK = r"(?:\(\?<=(?P<b2>°|\[[^\]]*\])?(?P<b1>\[.*?\])\))?"


def rule(piece):
    """One alternative as (before2, before, body, after, not_after), sets by name."""
    lit = literal(piece)
    if lit is not None:
        return (None, None, ("lit", [lit]), None, None)
    if piece == r"\.\.+":
        return (None, None, ("dots",), None, None)
    if piece == r"\+(?![0-9])":
        return (None, None, ("lit", ["+"]), None, char_set("0-9"))
    m = re.fullmatch(r"\[(.*)\]", piece)
    if m and not re.search(r"(?<!\\)\]", m.group(1)):
        return (None, None, ("set", char_set(m.group(1))), None, None)
    m = re.fullmatch(
        r"\(\?<=(?P<b2>°|\[[^\]]*\])?\[(?P<b1>.*?)\]\)(?P<body>.+?)(?:\(\?=\[(?P<a>.*)\]\))?",
        piece,
    )
    if m:
        body = m.group("body")
        if literal(body) is not None:
            alts = [literal(body)]
        elif body.startswith("(?:") and body.endswith(")"):
            alts = [literal(p) for p in body[3:-1].split("|")]
        elif body.startswith("[") and body.endswith("]"):
            chars = re.sub(r"\\(.)", r"\1", body[1:-1])
            alts = list(chars)
            assert all(re.fullmatch(body, c) for c in alts), piece
        else:
            alts = [None]
        if None not in alts:
            b2 = m.group("b2")
            if b2 == "°":
                b2 = char_set("°")
            elif b2 is not None:
                b2 = char_set(b2[1:-1])
            after = char_set(m.group("a")) if m.group("a") is not None else None
            return (b2, char_set(m.group("b1")), ("lit", alts), after, None)
    sys.exit(f"unrecognized tokenizer entry: {piece!r}")


def rs_str(s):
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif 0x20 <= ord(ch) < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\u{{{ord(ch):x}}}")
    return '"' + "".join(out) + '"'


def rs_rule(r):
    b2, b1, body, after, not_after = r
    opt = lambda s: f"Some(&{s})" if s else "None"
    if body[0] == "lit":
        body_rs = "Body::Lit(&[" + ", ".join(rs_str(a) for a in body[1]) + "])"
    elif body[0] == "dots":
        body_rs = "Body::Dots"
    else:
        body_rs = f"Body::Set(&{body[1]})"
    return (
        f"    Rule {{ before2: {opt(b2)}, before: {opt(b1)}, body: {body_rs}, "
        f"after: {opt(after)}, not_after: {opt(not_after)} }},"
    )


def rs_set(name, ranges, doc):
    ascii_mask = 0
    for lo, hi in ranges:
        for c in range(lo, min(hi, 127) + 1):
            ascii_mask |= 1 << c
    body = ", ".join(f"(0x{lo:x}, 0x{hi:x})" for lo, hi in ranges)
    return (
        f"/// {doc}\npub(super) static {name}: CharSet = CharSet {{ ascii: 0x{ascii_mask:x}, "
        f"ranges: &[{body}] }};\n"
    )


def main():
    check_versions()
    nlp = spacy.blank("en")
    tok = nlp.tokenizer
    assert tok.token_match is None, "the English tokenizer has no token_match"
    prefixes = [rule(p) for p in nlp.Defaults.prefixes if p.strip()]
    suffixes = [rule(p) for p in nlp.Defaults.suffixes if p.strip()]
    infixes = [rule(p) for p in nlp.Defaults.infixes if p.strip()]
    url = tok.url_match.__self__.pattern
    assert url.startswith("(?u)"), url[:10]
    # Python's `\w` is a letter, a number or `_` (`str.isalnum`); Rust's also takes marks and
    # connector punctuation. The pattern uses it inside character classes only.
    assert url.count(r"\w") == url.count(r"[\w"), "\\w outside a class"
    url = url.replace(r"\w", r"\p{L}\p{N}_")
    sentencizer = nlp.add_pipe("sentencizer")
    punct_chars = sorted(sentencizer.punct_chars)

    lines = [
        "// @generated by scripts/make_spacy_en_tables.py from spaCy "
        f"{PINNED['spacy']} (MIT), datatrove {PINNED['datatrove']} (Apache-2.0) and Python "
        f"{PINNED['python']}'s unicodedata (Unicode {PINNED['unicode']}). Do not edit by hand.",
        "",
        "use super::spacy_en::{Body, CharSet, Rule};",
        "",
        "/// spaCy's English prefixes, in its order (the first alternative that matches wins).",
        "pub(super) static PREFIXES: &[Rule] = &[",
        *[rs_rule(r) for r in prefixes],
        "];",
        "",
        "/// spaCy's English suffixes, in its order.",
        "pub(super) static SUFFIXES: &[Rule] = &[",
        *[rs_rule(r) for r in suffixes],
        "];",
        "",
        "/// spaCy's English infixes, in its order.",
        "pub(super) static INFIXES: &[Rule] = &[",
        *[rs_rule(r) for r in infixes],
        "];",
        "",
        "/// spaCy's URL pattern (`url_match`, a full match), Python `re` syntax that `fancy_regex`",
        "/// reads as is.",
        f"pub(super) static URL_PATTERN: &str = {rs_str(url[4:])};",
        "",
        "/// spaCy's special cases: the string and the tokens it becomes.",
        "pub(super) static SPECIAL_CASES: &[(&str, &[&str])] = &[",
    ]
    for chunk, substrings in sorted(tok.rules.items()):
        toks = ", ".join(rs_str(s[ORTH]) for s in substrings)
        lines.append(f"    ({rs_str(chunk)}, &[{toks}]),")
    lines += [
        "];",
        "",
        "/// The sentencizer's default punctuation (`Sentencizer.default_punct_chars`).",
        "pub(super) static SENTENCE_PUNCT: &[&str] = &["
        + ", ".join(rs_str(c) for c in punct_chars)
        + "];",
        "",
    ]
    out = "\n".join(lines) + "\n"
    for name, (body, ranges) in SETS.items():
        out += rs_set(name, ranges, f"`[{body[:60]}{'...' if len(body) > 60 else ''}]`".replace("\\", "\\\\"))
    out += rs_set("PY_SPACE", ranges_of(str.isspace), "Python's `str.isspace`.")
    out += rs_set("PY_ALPHA", ranges_of(str.isalpha), "Python's `str.isalpha`.")
    out += rs_set(
        "PUNCT_CATEGORY",
        ranges_of(lambda ch: unicodedata.category(ch).startswith("P")),
        "General category P* (spaCy's `is_punct`).",
    )
    out += rs_set(
        "DATATROVE_PUNCTUATION",
        ranges_of(lambda ch: ch in PUNCTUATION_SET),
        "datatrove's `PUNCTUATION_SET` (Gopher quality's symbol words).",
    )
    OUT.write_text(out)
    print(f"wrote {OUT}: {len(prefixes)} prefixes, {len(suffixes)} suffixes, {len(infixes)} infixes, "
          f"{len(tok.rules)} special cases, {len(SETS)} classes")


if __name__ == "__main__":
    main()
