//! Safety filter: banned words and blocked URLs, matched with Aho-Corasick (one pass over the
//! text for the whole list, ASCII case-insensitive, whole words only).
//!
//! - Any hard-banned word removes the document (`hard_banned_word`).
//! - Soft-banned words are counted (every occurrence); `soft_ban_threshold` or more removes it
//!   (`soft_banned_words`): a medical text may say a word once, a spam page says it forty times.
//! - A document whose URL host equals a blocked domain or is a subdomain of one is removed
//!   (`blocked_url`); documents without a URL pass this rule.
//!
//! Lists come inline in the config or from files (one entry per line, `#` starts a comment).
//! What it is not: a classifier; it removes what the lists name and nothing else.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use serde::Deserialize;
use std::path::PathBuf;

use super::document::{Document, DropReason, Verdict};

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SafetyFile {
    pub hard_words: Vec<String>,
    pub hard_words_file: Option<PathBuf>,
    pub soft_words: Vec<String>,
    pub soft_words_file: Option<PathBuf>,
    pub soft_ban_threshold: Option<usize>,
    pub blocked_domains: Vec<String>,
    pub blocked_domains_file: Option<PathBuf>,
}

#[derive(Clone, Debug)]
pub struct SafetyFilter {
    hard: Option<AhoCorasick>,
    soft: Option<AhoCorasick>,
    soft_ban_threshold: usize,
    blocked_domains: std::collections::HashSet<String>,
}

fn read_list(inline: &[String], file: &Option<PathBuf>) -> Result<Vec<String>, String> {
    let mut entries: Vec<String> = inline.iter().map(|w| w.trim().to_lowercase()).collect();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read list {}: {e}", path.display()))?;
        entries.extend(
            text.lines()
                .map(|l| l.split('#').next().unwrap_or("").trim().to_lowercase())
                .filter(|l| !l.is_empty()),
        );
    }
    entries.retain(|e| !e.is_empty());
    entries.sort();
    entries.dedup();
    Ok(entries)
}

fn automaton(words: &[String]) -> Result<Option<AhoCorasick>, String> {
    if words.is_empty() {
        return Ok(None);
    }
    AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::LeftmostLongest)
        .build(words)
        .map(Some)
        .map_err(|e| format!("cannot build word automaton: {e}"))
}

impl SafetyFile {
    pub fn validate(self) -> Result<SafetyFilter, String> {
        let hard = read_list(&self.hard_words, &self.hard_words_file)?;
        let soft = read_list(&self.soft_words, &self.soft_words_file)?;
        let domains = read_list(&self.blocked_domains, &self.blocked_domains_file)?;
        if hard.is_empty() && soft.is_empty() && domains.is_empty() {
            return Err("safety stage has no hard words, soft words or blocked domains".into());
        }
        let soft_ban_threshold = match (soft.is_empty(), self.soft_ban_threshold) {
            (true, _) => usize::MAX,
            (false, Some(0)) => return Err("soft_ban_threshold must be at least 1".into()),
            (false, Some(n)) => n,
            (false, None) => return Err("soft_words given without soft_ban_threshold".into()),
        };
        Ok(SafetyFilter {
            hard: automaton(&hard)?,
            soft: automaton(&soft)?,
            soft_ban_threshold,
            blocked_domains: domains
                .into_iter()
                .map(|d| {
                    d.trim_start_matches("*.")
                        .trim_start_matches('.')
                        .to_string()
                })
                .collect(),
        })
    }
}

/// Whole-word matches of the automaton in `text`, stopping once `limit` are found.
fn count_words(automaton: &AhoCorasick, text: &str, limit: usize) -> usize {
    let bytes = text.as_bytes();
    let is_word_byte = |b: u8| b.is_ascii_alphanumeric() || b >= 0x80;
    let mut count = 0;
    for m in automaton.find_iter(text) {
        let before = m.start().checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(m.end()).copied();
        if before.is_some_and(is_word_byte) || after.is_some_and(is_word_byte) {
            continue;
        }
        count += 1;
        if count >= limit {
            break;
        }
    }
    count
}

/// The host of an `http(s)://host[:port]/...` URL, lowercased.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit('@').next()?.split(':').next()?;
    (!host.is_empty()).then(|| host.to_lowercase())
}

impl SafetyFilter {
    pub fn apply(&self, doc: Document) -> Verdict {
        match self.check(&doc) {
            Some(reason) => Verdict::Drop(doc, reason),
            None => Verdict::Keep(doc),
        }
    }

    pub fn check(&self, doc: &Document) -> Option<DropReason> {
        if !self.blocked_domains.is_empty()
            && let Some(host) = doc.metadata.url.as_deref().and_then(url_host)
        {
            let mut candidate = host.as_str();
            loop {
                if self.blocked_domains.contains(candidate) {
                    return Some(DropReason::BlockedUrl);
                }
                match candidate.split_once('.') {
                    Some((_, parent)) => candidate = parent,
                    None => break,
                }
            }
        }
        if let Some(hard) = &self.hard
            && count_words(hard, &doc.text, 1) > 0
        {
            return Some(DropReason::HardBannedWord);
        }
        if let Some(soft) = &self.soft
            && count_words(soft, &doc.text, self.soft_ban_threshold) >= self.soft_ban_threshold
        {
            return Some(DropReason::SoftBannedWords);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter() -> SafetyFilter {
        SafetyFile {
            hard_words: vec!["forbidden".into()],
            soft_words: vec!["spam".into(), "casino".into()],
            soft_ban_threshold: Some(3),
            blocked_domains: vec!["bad.example".into()],
            ..Default::default()
        }
        .validate()
        .unwrap()
    }

    fn doc(text: &str) -> Document {
        Document::plain("d", text, "s")
    }

    #[test]
    fn hard_word_removes_on_whole_word_only() {
        assert_eq!(
            filter().check(&doc("This is FORBIDDEN here.")),
            Some(DropReason::HardBannedWord)
        );
        assert_eq!(
            filter().check(&doc("unforbiddenness is not the word")),
            None
        );
    }

    #[test]
    fn soft_words_remove_at_threshold() {
        assert_eq!(
            filter().check(&doc("spam, casino and more Spam")),
            Some(DropReason::SoftBannedWords)
        );
        assert_eq!(filter().check(&doc("spam and casino only")), None);
    }

    #[test]
    fn blocked_domains_cover_subdomains() {
        let mut d = doc("clean text");
        d.metadata.url = Some("https://www.bad.example/page?q=1".into());
        assert_eq!(filter().check(&d), Some(DropReason::BlockedUrl));
        d.metadata.url = Some("https://notbad.example/".into());
        assert_eq!(filter().check(&d), None);
    }

    #[test]
    fn lists_load_from_files_with_comments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hard.txt");
        std::fs::write(&path, "# banned\nbadword   # trailing comment\n\n").unwrap();
        let f = SafetyFile {
            hard_words_file: Some(path),
            ..Default::default()
        }
        .validate()
        .unwrap();
        assert_eq!(
            f.check(&doc("a badword here")),
            Some(DropReason::HardBannedWord)
        );
        let missing = SafetyFile {
            hard_words_file: Some("/nonexistent/list.txt".into()),
            ..Default::default()
        };
        assert!(
            missing
                .validate()
                .unwrap_err()
                .contains("/nonexistent/list.txt")
        );
    }
}
