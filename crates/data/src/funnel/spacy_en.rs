//! datatrove's English word tokenizer, without Python: spaCy's rule-based tokenizer as
//! `spacy.blank("en")` runs it (whitespace split, special cases, prefixes, suffixes, infixes,
//! URL match) and its `sentencizer`, which datatrove's Gopher, C4 and FineWeb filters call
//! through `split_into_words` / `split_into_sentences`.
//!
//! The rules and character classes are generated from spaCy 3.8.18 by
//! `scripts/make_spacy_en_tables.py` into `spacy_en_tables.rs`; this file ports the algorithm of
//! spaCy's `Tokenizer.__call__` (`_tokenize_affixes`, `_split_affixes`, `_attach_tokens`) and
//! `Sentencizer.predict`. The regexes are matched by hand (the alternatives in spaCy's order, the
//! first that matches wins, as Python's `re` does), which keeps the common case, a run of ASCII
//! letters, to one hash lookup. spaCy's URL pattern is the one regex left, run only on tokens
//! that an infix would otherwise split.
//!
//! Known difference: spaCy's second pass (`_apply_special_cases`, a phrase matcher that re-joins
//! special cases split across affix tokens, such as `:)` inside `(:)`) is not ported; the
//! agreement fixture (`crates/data/tests/fixtures/spacy_en_tokens.jsonl`) records where that
//! changes a word list.

use std::sync::LazyLock;

use super::spacy_en_tables::{
    DATATROVE_PUNCTUATION, INFIXES, PREFIXES, PUNCT_CATEGORY, PY_ALPHA, PY_SPACE, SENTENCE_PUNCT,
    SPECIAL_CASES, SUFFIXES, URL_PATTERN,
};
use super::text::PrehashedMap;

/// A set of characters: a bitmap for ASCII, sorted inclusive ranges for the rest.
pub(super) struct CharSet {
    pub ascii: u128,
    pub ranges: &'static [(u32, u32)],
}

impl CharSet {
    #[inline]
    pub fn contains(&self, c: char) -> bool {
        let u = c as u32;
        if u < 128 {
            (self.ascii >> u) & 1 == 1
        } else {
            self.ranges
                .binary_search_by(|&(lo, hi)| {
                    if hi < u {
                        std::cmp::Ordering::Less
                    } else if lo > u {
                        std::cmp::Ordering::Greater
                    } else {
                        std::cmp::Ordering::Equal
                    }
                })
                .is_ok()
        }
    }
}

/// What a rule matches after its look-behind.
pub(super) enum Body {
    /// The first of these strings that fits (with the look-ahead) wins.
    Lit(&'static [&'static str]),
    /// `\.\.+`, greedy.
    Dots,
    /// One character of the set.
    Set(&'static CharSet),
}

/// One alternative of spaCy's prefix, suffix or infix regex:
/// `(?<=[before2][before]) body (?=[after]) (?![not_after])`.
pub(super) struct Rule {
    pub before2: Option<&'static CharSet>,
    pub before: Option<&'static CharSet>,
    pub body: Body,
    pub after: Option<&'static CharSet>,
    pub not_after: Option<&'static CharSet>,
}

impl Rule {
    /// The end of this rule's match of alternative `alt` (the only one for `Dots` and `Set`
    /// bodies) starting at byte `p` of `s` (look-behind sees `s[..p]`), ending at `s.len()`
    /// when `to_end` (a suffix, `...$`).
    fn match_alt(&self, s: &str, p: usize, to_end: bool, alt: usize) -> Option<usize> {
        if let Some(before) = self.before {
            let mut back = s[..p].chars().rev();
            if !back.next().is_some_and(|c| before.contains(c)) {
                return None;
            }
            if let Some(before2) = self.before2
                && !back.next().is_some_and(|c| before2.contains(c))
            {
                return None;
            }
        }
        let fits = |end: usize| {
            if to_end && end != s.len() {
                return false;
            }
            let next = s[end..].chars().next();
            self.after
                .is_none_or(|set| next.is_some_and(|c| set.contains(c)))
                && self
                    .not_after
                    .is_none_or(|set| !next.is_some_and(|c| set.contains(c)))
        };
        let rest = &s[p..];
        match self.body {
            Body::Lit(alternatives) => {
                let a = alternatives[alt];
                (rest.starts_with(a) && fits(p + a.len())).then_some(p + a.len())
            }
            Body::Dots => {
                let run = rest.bytes().take_while(|&b| b == b'.').count();
                (2..=run).rev().map(|k| p + k).find(|&end| fits(end))
            }
            Body::Set(set) => {
                let c = rest.chars().next()?;
                let end = p + c.len_utf8();
                (set.contains(c) && fits(end)).then_some(end)
            }
        }
    }

    /// The longest string a `Lit` body can match, in bytes (0 for the other bodies).
    fn longest_literal(&self) -> usize {
        match self.body {
            Body::Lit(alternatives) => alternatives.iter().map(|a| a.len()).max().unwrap_or(0),
            Body::Dots | Body::Set(_) => 0,
        }
    }
}

/// The alternatives of a rule list by the character they start with, so that a position is
/// tested only against the alternatives that can match there, in the list's order.
struct RuleIndex {
    rules: &'static [Rule],
    /// (rule, alternative) pairs, in order, for each ASCII first character.
    ascii: Vec<Vec<(u16, u16)>>,
    /// The same for other first characters of literals.
    other: std::collections::HashMap<char, Vec<(u16, u16)>>,
    /// Rules whose body is a non-ASCII character set (checked by membership).
    sets: Vec<u16>,
}

impl RuleIndex {
    fn new(rules: &'static [Rule]) -> Self {
        let mut ascii = vec![Vec::new(); 128];
        let mut other: std::collections::HashMap<char, Vec<(u16, u16)>> = Default::default();
        let mut sets = Vec::new();
        for (r, rule) in rules.iter().enumerate() {
            let r = r as u16;
            match rule.body {
                Body::Lit(alternatives) => {
                    for (a, lit) in alternatives.iter().enumerate() {
                        let Some(c) = lit.chars().next() else {
                            continue;
                        };
                        let entry = (r, a as u16);
                        if c.is_ascii() {
                            ascii[c as usize].push(entry);
                        } else {
                            other.entry(c).or_default().push(entry);
                        }
                    }
                }
                Body::Dots => ascii[b'.' as usize].push((r, 0)),
                Body::Set(set) => {
                    for (c, list) in ascii.iter_mut().enumerate() {
                        if set.contains(char::from(c as u8)) {
                            list.push((r, 0));
                        }
                    }
                    if !set.ranges.is_empty() {
                        sets.push(r);
                    }
                }
            }
        }
        RuleIndex {
            rules,
            ascii,
            other,
            sets,
        }
    }

    /// The first alternative, in list order, matching at `p`: its end.
    fn match_at(&self, s: &str, p: usize, to_end: bool) -> Option<usize> {
        let c = s[p..].chars().next()?;
        let try_entry =
            |&(r, a): &(u16, u16)| self.rules[r as usize].match_alt(s, p, to_end, a as usize);
        if c.is_ascii() {
            return self.ascii[c as usize].iter().find_map(try_entry);
        }
        let mut candidates: Vec<(u16, u16)> = self.other.get(&c).cloned().unwrap_or_default();
        candidates.extend(
            self.sets
                .iter()
                .filter(
                    |&&r| matches!(self.rules[r as usize].body, Body::Set(set) if set.contains(c)),
                )
                .map(|&r| (r, 0)),
        );
        if candidates.is_empty() {
            return None;
        }
        candidates.sort_unstable();
        candidates.iter().find_map(try_entry)
    }

    /// Whether any alternative can start with this ASCII byte.
    fn ascii_can_start(&self, b: u8) -> bool {
        !self.ascii[b as usize].is_empty()
    }
}

struct Tables {
    /// False only while the special-case matcher's patterns are built (spaCy's
    /// `_tokenize_affixes(string, False)`).
    with_specials: bool,
    specials: PrehashedMap<(&'static str, &'static [&'static str])>,
    /// Which (first byte, last byte) pairs some special case has: most strings are rejected
    /// without hashing.
    special_ends: Vec<u64>,
    /// The lengths (bit `min(len, 63)`) of the special cases starting, and ending, with a byte.
    special_lengths_first: [u64; 256],
    special_lengths_last: [u64; 256],
    longest_special: usize,
    longest_suffix: usize,
    url: Option<fancy_regex::Regex>,
    prefixes: RuleIndex,
    suffixes: RuleIndex,
    infixes: RuleIndex,
    /// spaCy's special-case matcher: the special cases that affixes would split, by the hash of
    /// the first token they split into: (tokens, pieces of the special case).
    matcher: PrehashedMap<Vec<(Vec<&'static str>, &'static [&'static str])>>,
    /// The first bytes of the matcher's first tokens, and their lengths (bit `min(len, 63)`).
    matcher_first_bytes: [bool; 256],
    matcher_lengths: u64,
    /// The sentencizer's punctuation characters, sorted.
    sentence_punct: Vec<char>,
    /// ASCII characters that, before ASCII letters, are a one-character prefix.
    quick_prefix: [bool; 128],
    /// ASCII characters that, after ASCII letters (any), are a one-character suffix.
    quick_suffix: [bool; 128],
}

/// Spans up to this many bytes have their tokenization cached (lengths fit a byte).
const CACHED_SPAN_BYTES: usize = 64;
/// The cache is cleared when it holds this many spans (about 5 MB per thread).
const CACHE_ENTRIES: usize = 1 << 16;

/// A text's hash, its length and its words' byte ranges.
type LastWords = (u64, usize, Vec<(u32, u32)>);

/// A cached span and the byte lengths of its tokens, by the span's hash.
type SpanCache = PrehashedMap<(Box<str>, Box<[u8]>)>;

thread_local! {
    /// The last text [`words`] tokenized.
    static LAST_WORDS: std::cell::RefCell<LastWords> =
        const { std::cell::RefCell::new((0, usize::MAX, Vec::new())) };
    /// spaCy's own cache: the token lengths of spans that took the general path.
    static CACHE: std::cell::RefCell<SpanCache> = std::cell::RefCell::new(SpanCache::default());
}

/// The (first byte, last byte) pair of a non-empty string, as one index.
fn end_pair(s: &str) -> usize {
    let b = s.as_bytes();
    usize::from(b[0]) << 8 | usize::from(b[b.len() - 1])
}

fn key(s: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(s.as_bytes())
}

static TABLES: LazyLock<Tables> = LazyLock::new(|| {
    let mut specials = PrehashedMap::default();
    let mut special_ends = vec![0u64; 256 * 256 / 64];
    let mut special_lengths_first = [0u64; 256];
    let mut special_lengths_last = [0u64; 256];
    for &(chunk, pieces) in SPECIAL_CASES {
        specials.insert(key(chunk), (chunk, pieces));
        let pair = end_pair(chunk);
        special_ends[pair / 64] |= 1 << (pair % 64);
        let bytes = chunk.as_bytes();
        if let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) {
            special_lengths_first[usize::from(first)] |= 1 << chunk.len().min(63);
            special_lengths_last[usize::from(last)] |= 1 << chunk.len().min(63);
        }
    }
    let mut sentence_punct: Vec<char> = SENTENCE_PUNCT
        .iter()
        .filter_map(|p| p.chars().next())
        .collect();
    sentence_punct.sort_unstable();
    let mut tables = Tables {
        with_specials: false,
        specials,
        special_ends,
        special_lengths_first,
        special_lengths_last,
        longest_special: SPECIAL_CASES
            .iter()
            .map(|(c, _)| c.len())
            .max()
            .unwrap_or(0),
        longest_suffix: SUFFIXES
            .iter()
            .map(Rule::longest_literal)
            .max()
            .unwrap_or(0),
        // The pattern is generated and compiled by a test; `None` would only disable URL
        // matching (a token an infix splits stays split).
        url: fancy_regex::Regex::new(URL_PATTERN).ok(),
        prefixes: RuleIndex::new(PREFIXES),
        suffixes: RuleIndex::new(SUFFIXES),
        infixes: RuleIndex::new(INFIXES),
        matcher: PrehashedMap::default(),
        matcher_first_bytes: [false; 256],
        matcher_lengths: 0,
        sentence_punct,
        quick_prefix: [false; 128],
        quick_suffix: [false; 128],
    };
    for b in 0u8..128 {
        if b.is_ascii_alphanumeric() || b.is_ascii_whitespace() || b == b'.' {
            continue;
        }
        let c = char::from(b);
        tables.quick_prefix[usize::from(b)] = tables.find_prefix(&format!("{c}ab")) == 1
            && tables.find_prefix(&format!("{c}AB")) == 1;
        tables.quick_suffix[usize::from(b)] = ["a", "A", "AA", "aA", "Aa"]
            .iter()
            .all(|w| tables.find_suffix(&format!("{w}{c}")) == 1);
    }
    // spaCy's `add_special_case` (with `faster_heuristics`): a special case that a prefix,
    // suffix or infix would match, or that holds a space, joins the matcher as the tokens the
    // affix rules alone make of it.
    let mut matcher: PrehashedMap<Vec<_>> = PrehashedMap::default();
    for &(chunk, pieces) in SPECIAL_CASES {
        let affixed = tables.find_prefix(chunk) != 0
            || !tables.find_infixes(chunk).is_empty()
            || tables.find_suffix(chunk) != 0
            || chunk.contains(' ');
        if affixed {
            let pattern = tables.tokens(chunk, true);
            if let Some(first) = pattern.first() {
                tables.matcher_first_bytes[usize::from(first.as_bytes()[0])] = true;
                tables.matcher_lengths |= 1 << first.len().min(63);
                matcher
                    .entry(key(first))
                    .or_default()
                    .push((pattern, pieces));
            }
        }
    }
    tables.matcher = matcher;
    tables.with_specials = true;
    tables
});

impl Tables {
    #[inline]
    fn special(&self, s: &str) -> Option<&'static [&'static str]> {
        if !self.with_specials || s.is_empty() || s.len() > self.longest_special {
            return None;
        }
        let bytes = s.as_bytes();
        let length = 1u64 << s.len().min(63);
        if self.special_lengths_first[usize::from(bytes[0])] & length == 0
            || self.special_lengths_last[usize::from(bytes[bytes.len() - 1])] & length == 0
        {
            return None;
        }
        let pair = end_pair(s);
        if self.special_ends[pair / 64] & (1 << (pair % 64)) == 0 {
            return None;
        }
        match self.specials.get(&key(s)) {
            Some(&(chunk, pieces)) if chunk == s => Some(pieces),
            _ => None,
        }
    }

    fn find_prefix(&self, s: &str) -> usize {
        self.prefixes.match_at(s, 0, false).unwrap_or(0)
    }

    /// The length of the leftmost suffix match (as `re.search` finds it), 0 when none.
    fn find_suffix(&self, s: &str) -> usize {
        // A match starts inside the trailing dots (`\.\.+`) or within the longest literal (or
        // one set character) of the end; nothing further left can match.
        let trailing_dots = s.len() - s.trim_end_matches('.').len();
        let dots_start = if trailing_dots >= 2 {
            s.len() - trailing_dots
        } else {
            s.len()
        };
        let literal_start = s.len().saturating_sub(self.longest_suffix.max(4));
        let start = dots_start.min(literal_start);
        for (p, _) in s.char_indices().filter(|&(p, _)| p >= start) {
            if self.suffixes.match_at(s, p, true).is_some() {
                return s.len() - p;
            }
        }
        0
    }

    /// The infix matches of `s`, as `re.finditer` finds them: (start, end) in bytes.
    fn find_infixes(&self, s: &str) -> Vec<(usize, usize)> {
        let mut matches = Vec::new();
        let mut p = 0;
        let bytes = s.as_bytes();
        while p < s.len() {
            if bytes[p].is_ascii() && !self.infixes.ascii_can_start(bytes[p]) {
                p += 1;
                continue;
            }
            match self.infixes.match_at(s, p, false) {
                Some(end) => {
                    matches.push((p, end));
                    p = end;
                }
                None => p += s[p..].chars().next().map_or(1, char::len_utf8),
            }
        }
        matches
    }

    fn url_match(&self, s: &str) -> bool {
        self.url
            .as_ref()
            .is_some_and(|re| re.is_match(s).unwrap_or(false))
    }

    /// Pushes the special case's tokens as slices of `s` (its pieces concatenate to `s`).
    fn push_special<'a>(s: &'a str, pieces: &[&str], out: &mut Vec<&'a str>) {
        let mut at = 0;
        for piece in pieces {
            out.push(&s[at..at + piece.len()]);
            at += piece.len();
        }
    }

    /// spaCy's `_tokenize_affixes`: every token of `text`, whitespace tokens included: each
    /// run of whitespace other than the single space that follows a token is a token.
    fn tokens<'a>(&self, text: &'a str, keep_space: bool) -> Vec<&'a str> {
        let mut out = Vec::with_capacity(text.len() / 4);
        let Some(first) = text.chars().next() else {
            return out;
        };
        let mut in_ws = py_isspace(first);
        let mut start = 0;
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            let (space, width) = if b.is_ascii() {
                (ASCII_SPACE[usize::from(b)], 1)
            } else {
                let c = text[i..].chars().next().unwrap_or(' ');
                (py_isspace(c), c.len_utf8())
            };
            if space != in_ws {
                if start < i {
                    if !in_ws {
                        self.tokenize_span(&text[start..i], &mut out);
                    } else if keep_space {
                        // A whitespace run is one token: no affix rule or special case splits
                        // whitespace.
                        out.push(&text[start..i]);
                    }
                }
                start = if b == b' ' { i + 1 } else { i };
                in_ws = !in_ws;
            }
            i += width;
        }
        if start < text.len() {
            if !in_ws {
                self.tokenize_span(&text[start..], &mut out);
            } else if keep_space {
                out.push(&text[start..]);
            }
        }
        self.apply_special_matcher(text, &mut out);
        out
    }

    /// spaCy's `_apply_special_cases`: a phrase matcher finds every run of tokens equal to
    /// the affix split of a special case; overlapping runs go longest first, then leftmost, and
    /// a run whose first or last token is taken is dropped; a kept run whose tokens are
    /// contiguous in the text (so its text is the special case) becomes the special case's own
    /// tokens.
    ///
    /// spaCy's runs are of consecutive tokens of its document, where a single space after a
    /// token is no token but any other whitespace is: two tokens here are consecutive there when
    /// nothing or one space lies between them, whether or not `out` holds the whitespace tokens.
    fn apply_special_matcher<'a>(&self, text: &'a str, out: &mut Vec<&'a str>) {
        if self.matcher.is_empty() || out.is_empty() {
            return;
        }
        let offset = |token: &str| token.as_ptr() as usize - text.as_ptr() as usize;
        let mut found: Vec<(usize, usize, &'static [&'static str])> = Vec::new();
        for i in 0..out.len() {
            let token = out[i];
            if !self.matcher_first_bytes[usize::from(token.as_bytes()[0])]
                || self.matcher_lengths & (1 << token.len().min(63)) == 0
            {
                continue;
            }
            if let Some(candidates) = self.matcher.get(&key(token)) {
                for (pattern, pieces) in candidates {
                    let end = i + pattern.len();
                    if end <= out.len()
                        && out[i..end] == pattern[..]
                        && out[i..end].windows(2).all(|w| {
                            let gap = offset(w[1]) - (offset(w[0]) + w[0].len());
                            gap == 0 || (gap == 1 && text.as_bytes()[offset(w[1]) - 1] == b' ')
                        })
                    {
                        found.push((i, end, pieces));
                    }
                }
            }
        }
        if found.is_empty() {
            return;
        }
        found.sort_by_key(|&(start, end, _)| (std::cmp::Reverse(end - start), start));
        let mut taken = vec![false; out.len()];
        let mut kept = Vec::new();
        for (start, end, pieces) in found {
            if !taken[start] && !taken[end - 1] {
                kept.push((start, end, pieces));
            }
            for t in &mut taken[start..end] {
                *t = true;
            }
        }
        kept.sort_by_key(|&(start, _, _)| start);
        let tokens = std::mem::take(out);
        let mut i = 0;
        for (start, end, pieces) in kept {
            let contiguous = tokens[start..end]
                .windows(2)
                .all(|w| offset(w[0]) + w[0].len() == offset(w[1]));
            if !contiguous {
                continue;
            }
            out.extend_from_slice(&tokens[i..start]);
            let (first, last) = (tokens[start], tokens[end - 1]);
            Self::push_special(&text[offset(first)..offset(last) + last.len()], pieces, out);
            i = end;
        }
        out.extend_from_slice(&tokens[i..]);
    }

    /// spaCy's `_tokenize` of one whitespace-free span (or one whitespace run).
    fn tokenize_span<'a>(&self, span: &'a str, out: &mut Vec<&'a str>) {
        if let Some(pieces) = self.special(span) {
            Self::push_special(span, pieces, out);
            return;
        }
        if span.bytes().all(|b| b.is_ascii_alphabetic()) {
            // No prefix, suffix or infix starts with an ASCII letter unless a digit precedes
            // it (units), and the span has no digit: one token.
            out.push(span);
            return;
        }
        if let Some((pre, suf)) = self.quick_affixes(span) {
            let word = &span[pre..span.len() - suf];
            if pre == 1 {
                out.push(&span[..1]);
            }
            match self.special(word) {
                Some(pieces) => Self::push_special(word, pieces, out),
                None => out.push(word),
            }
            if suf == 1 {
                out.push(&span[span.len() - 1..]);
            }
            return;
        }
        if span.len() <= CACHED_SPAN_BYTES && self.with_specials {
            let h = key(span);
            let hit = CACHE.with_borrow(|cache| match cache.get(&h) {
                Some((text, lengths)) if &**text == span => {
                    let mut at = 0;
                    for &len in lengths.iter() {
                        out.push(&span[at..at + usize::from(len)]);
                        at += usize::from(len);
                    }
                    true
                }
                _ => false,
            });
            if hit {
                return;
            }
            let from = out.len();
            self.tokenize_general(span, out);
            let lengths: Box<[u8]> = out[from..].iter().map(|t| t.len() as u8).collect();
            CACHE.with_borrow_mut(|cache| {
                if cache.len() >= CACHE_ENTRIES {
                    cache.clear();
                }
                cache.insert(h, (span.into(), lengths));
            });
        } else {
            self.tokenize_general(span, out);
        }
    }

    /// [`Self::tokenize_span`] past the fast paths: spaCy's affix loop, infixes and URL match.
    fn tokenize_general<'a>(&self, span: &'a str, out: &mut Vec<&'a str>) {
        let mut prefixes = Vec::new();
        let mut suffixes = Vec::new();
        let rest = self.split_affixes(span, &mut prefixes, &mut suffixes);
        out.extend(prefixes);
        if !rest.is_empty() {
            if let Some(pieces) = self.special(rest) {
                Self::push_special(rest, pieces, out);
            } else {
                let infixes = self.find_infixes(rest);
                if infixes.is_empty() || self.url_match(rest) {
                    out.push(rest);
                } else {
                    let mut start = 0;
                    for (infix_start, infix_end) in infixes {
                        if infix_start == 0 {
                            continue;
                        }
                        if infix_start != start {
                            out.push(&rest[start..infix_start]);
                        }
                        if infix_start != infix_end {
                            out.push(&rest[infix_start..infix_end]);
                        }
                        start = infix_end;
                    }
                    if start < rest.len() {
                        out.push(&rest[start..]);
                    }
                }
            }
        }
        out.extend(suffixes.into_iter().rev());
    }

    /// The common case `(word`, `word,`, `"word".` reduced to one prefix and one suffix
    /// byte around ASCII letters: (prefix length, suffix length), `None` when the general path
    /// must decide (anything else, or a special case is in play).
    fn quick_affixes(&self, span: &str) -> Option<(usize, usize)> {
        let b = span.as_bytes();
        let (first, last) = (b[0], b[b.len() - 1]);
        let pre = usize::from(!first.is_ascii_alphabetic());
        let suf = usize::from(!last.is_ascii_alphabetic());
        if b.len() < pre + suf + 1 || !b[pre..b.len() - suf].iter().all(u8::is_ascii_alphabetic) {
            return None;
        }
        if pre == 1 && !(first.is_ascii() && self.quick_prefix[usize::from(first)]) {
            return None;
        }
        if suf == 1 {
            let ok = if last == b'.' {
                // `(?<=[a-z...])\.`: a lower-case letter before; upper case needs the rules.
                b[b.len() - 2].is_ascii_lowercase()
            } else {
                last.is_ascii() && self.quick_suffix[usize::from(last)]
            };
            if !ok {
                return None;
            }
        }
        // The spaCy loop stops early when what is left after the first prefix or suffix is a
        // special case: leave those to it.
        if (pre == 1 && self.special(&span[1..]).is_some())
            || (suf == 1 && self.special(&span[..span.len() - 1]).is_some())
        {
            return None;
        }
        Some((pre, suf))
    }

    /// spaCy's `_split_affixes`: strips prefixes and suffixes until none is left or a special
    /// case remains.
    fn split_affixes<'a>(
        &self,
        mut s: &'a str,
        prefixes: &mut Vec<&'a str>,
        suffixes: &mut Vec<&'a str>,
    ) -> &'a str {
        let mut last_size = 0;
        while !s.is_empty() && s.len() != last_size {
            if self.special(s).is_some() {
                break;
            }
            last_size = s.len();
            let pre_len = self.find_prefix(s);
            if pre_len != 0 {
                let minus_pre = &s[pre_len..];
                if !minus_pre.is_empty() && self.special(minus_pre).is_some() {
                    prefixes.push(&s[..pre_len]);
                    s = minus_pre;
                    break;
                }
            }
            let suf_len = self.find_suffix(&s[pre_len..]);
            if suf_len != 0 {
                let minus_suf = &s[..s.len() - suf_len];
                if !minus_suf.is_empty() && self.special(minus_suf).is_some() {
                    suffixes.push(&s[s.len() - suf_len..]);
                    s = minus_suf;
                    break;
                }
            }
            if pre_len != 0 && suf_len != 0 {
                prefixes.push(&s[..pre_len]);
                suffixes.push(&s[s.len() - suf_len..]);
                s = &s[pre_len..s.len() - suf_len];
            } else if pre_len != 0 {
                prefixes.push(&s[..pre_len]);
                s = &s[pre_len..];
            } else if suf_len != 0 {
                suffixes.push(&s[s.len() - suf_len..]);
                s = &s[..s.len() - suf_len];
            }
        }
        s
    }
}

/// [`py_isspace`] for ASCII bytes.
const ASCII_SPACE: [bool; 128] = {
    let mut table = [false; 128];
    let mut b = 0;
    while b < 128 {
        table[b] = matches!(b as u8, b'\t'..=b'\r' | 0x1c..=0x1f | b' ');
        b += 1;
    }
    table
};

/// Python's `str.isspace` (it counts U+001C..U+001F, which Rust's `char::is_whitespace` does
/// not).
#[inline]
pub fn py_isspace(c: char) -> bool {
    if c.is_ascii() {
        matches!(c, '\t'..='\r' | '\x1c'..='\x1f' | ' ')
    } else {
        PY_SPACE.contains(c)
    }
}

/// Python's `str.isalpha` for one character (Unicode letters, categories L*; Rust's
/// `char::is_alphabetic` also takes marks and letter numbers).
#[inline]
pub fn py_isalpha(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_alphabetic()
    } else {
        PY_ALPHA.contains(c)
    }
}

/// Whether `c` is in datatrove's `PUNCTUATION_SET`.
#[inline]
pub fn is_datatrove_punctuation(c: char) -> bool {
    DATATROVE_PUNCTUATION.contains(c)
}

/// Every token spaCy makes of `text`, whitespace tokens included: each run of whitespace
/// other than the single space that follows a token is a token of its own.
pub fn spacy_tokens(text: &str) -> Vec<&str> {
    TABLES.tokens(text, true)
}

/// datatrove's English `word_tokenize`: spaCy's tokens, stripped, empty ones dropped.
///
/// The last text's word boundaries are kept per thread (keyed by its xxh3 hash and length), so
/// the filters that run one after another on one document tokenize it once.
pub fn words(text: &str) -> Vec<&str> {
    let h = key(text);
    let cached = LAST_WORDS.with_borrow(|(hash, len, bounds)| {
        (*hash == h && *len == text.len()).then(|| {
            bounds
                .iter()
                .map(|&(at, n)| &text[at as usize..(at + n) as usize])
                .collect()
        })
    });
    if let Some(words) = cached {
        return words;
    }
    // Whitespace runs are tokens for spaCy, stripped away by datatrove: never made here.
    let words = TABLES.tokens(text, false);
    if text.len() <= u32::MAX as usize {
        let offset = |w: &str| (w.as_ptr() as usize - text.as_ptr() as usize) as u32;
        let bounds = words.iter().map(|w| (offset(w), w.len() as u32)).collect();
        LAST_WORDS.set((h, text.len(), bounds));
    }
    words
}

/// spaCy's lexical `is_punct`: every character in a P* category.
fn is_punct(token: &str) -> bool {
    token.chars().all(|c| PUNCT_CATEGORY.contains(c))
}

/// The number of sentences datatrove's `split_into_sentences` returns for `text` (the
/// sentencizer's rule: a sentence ends after a token that is one of its punctuation
/// characters, at the next token that is not punctuation). An empty text counts one, as
/// datatrove's split returns the whole text then.
pub fn sentence_count(text: &str) -> usize {
    let tables = &*TABLES;
    let mut count = 1;
    let mut seen_period = false;
    for token in tables.tokens(text, true) {
        let mut chars = token.chars();
        let in_punct_chars = match (chars.next(), chars.next()) {
            (Some(c), None) => tables.sentence_punct.binary_search(&c).is_ok(),
            _ => false,
        };
        if seen_period && !in_punct_chars && !is_punct(token) {
            count += 1;
            seen_period = false;
        } else if in_punct_chars {
            seen_period = true;
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_runs_are_single_tokens_under_every_rule() {
        // `tokens` pushes a whitespace run as it is: no special case, affix or infix may split
        // one.
        let tables = &*TABLES;
        for run in [
            " ", "  ", "\n", "\n\n", "\t \n", "\u{a0}", "\u{3000}", "\u{2028}", "\x1c",
        ] {
            let mut out = Vec::new();
            tables.tokenize_span(run, &mut out);
            assert_eq!(out, [run], "{run:?}");
        }
    }

    #[test]
    fn the_generated_url_pattern_compiles() {
        assert!(
            TABLES.url.is_some(),
            "spaCy's URL pattern must compile with fancy_regex"
        );
        assert!(TABLES.url_match("https://example.com/a-b"));
        assert!(!TABLES.url_match("D-Bus"));
    }

    #[test]
    fn the_issue_examples_tokenize_as_spacy_does() {
        assert_eq!(words("D-Bus"), ["D", "-", "Bus"]);
        assert_eq!(words("(see above),"), ["(", "see", "above", ")", ","]);
        assert_eq!(
            words("version 1.16 of Makefile.in"),
            ["version", "1.16", "of", "Makefile.in"]
        );
        assert_eq!(words("don't stop"), ["do", "n't", "stop"]);
        assert_eq!(sentence_count("Google Inc. All rights reserved."), 1);
        assert_eq!(sentence_count("One. Two! Three?"), 3);
    }
}
