//! Main-text extraction from HTML: turns `content_type = html` documents into plain text, one
//! block (paragraph, heading, list item, cell) per line. Plain documents pass through.
//!
//! Crate choice: `scraper` (html5ever, the Servo HTML5 parser) parses real-world markup the way
//! browsers do, including broken nesting. Readability ports (`readability`, `dom_smoothie`) pick
//! one "article" node and return nothing for list, forum or index pages, which a pretraining
//! corpus still wants; the rules below are the trafilatura-style core instead:
//! - drop non-content elements wholesale: scripts, styles, `nav`, `header`, `footer`, `aside`,
//!   forms, iframes, SVG, templates, and elements whose class or id names boilerplate
//!   (`nav`, `menu`, `header`, `footer`, `sidebar`, `cookie`, `breadcrumb`, `share`, `advert`, ...);
//! - drop blocks whose text is mostly link text (link density above `max_link_density`): menus
//!   and tag clouds that escaped the first rule.
//!
//! What it is not: a charset sniffer (input is decoded before it arrives here) or a layout
//! engine (CSS-hidden text is kept). A document with no text left is removed (`extraction_empty`).

use ego_tree::iter::Edge;
use scraper::{Html, Node};
use serde::Deserialize;

use super::document::{ContentType, Document, DropReason, Verdict};

const DROPPED_ELEMENTS: &[&str] = &[
    "script", "style", "noscript", "nav", "header", "footer", "aside", "form", "iframe", "svg",
    "template", "button", "select", "head", "menu", "object", "embed", "canvas",
];
const BLOCK_ELEMENTS: &[&str] = &[
    "p",
    "div",
    "li",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "td",
    "th",
    "tr",
    "pre",
    "blockquote",
    "article",
    "section",
    "main",
    "br",
    "dd",
    "dt",
    "ul",
    "ol",
    "table",
    "figcaption",
    "hr",
];
const BOILERPLATE_NAMES: &[&str] = &[
    "nav",
    "navbar",
    "menu",
    "header",
    "masthead",
    "footer",
    "sidebar",
    "cookie",
    "cookies",
    "breadcrumb",
    "breadcrumbs",
    "share",
    "social",
    "advert",
    "ads",
    "banner",
    "popup",
    "related",
    "comment",
    "comments",
];

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExtractFile {
    pub max_link_density: f64,
    /// Blocks with fewer words than this are dropped when they are link text at all.
    pub min_block_words: usize,
}

impl Default for ExtractFile {
    fn default() -> Self {
        ExtractFile {
            max_link_density: 0.5,
            min_block_words: 0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Extractor {
    file: ExtractFile,
}

impl ExtractFile {
    pub fn validate(self) -> Result<Extractor, String> {
        if !(0.0..=1.0).contains(&self.max_link_density) {
            return Err(format!(
                "max_link_density must be within [0, 1], got {}",
                self.max_link_density
            ));
        }
        Ok(Extractor { file: self })
    }
}

fn is_boilerplate(element: &scraper::node::Element) -> bool {
    if DROPPED_ELEMENTS.contains(&element.name()) {
        return true;
    }
    if element.attr("hidden").is_some() || element.attr("aria-hidden") == Some("true") {
        return true;
    }
    let names = [
        element.attr("class").unwrap_or(""),
        element.id().unwrap_or(""),
    ];
    names.iter().any(|value| {
        value
            .split(|c: char| c.is_whitespace() || c == '-' || c == '_')
            .any(|part| BOILERPLATE_NAMES.contains(&part.to_ascii_lowercase().as_str()))
    })
}

#[derive(Default)]
struct Block {
    text: String,
    link_chars: usize,
}

impl Extractor {
    pub fn apply(&self, mut doc: Document) -> Verdict {
        if doc.metadata.content_type != ContentType::Html {
            return Verdict::Keep(doc);
        }
        let text = self.extract(&doc.text);
        doc.metadata.content_type = ContentType::Plain;
        if text.trim().is_empty() {
            doc.text = text;
            return Verdict::Drop(doc, DropReason::ExtractionEmpty);
        }
        doc.text = text;
        Verdict::Keep(doc)
    }

    /// The main text of an HTML page, one block per line.
    pub fn extract(&self, html: &str) -> String {
        let page = Html::parse_document(html);
        let mut blocks: Vec<String> = Vec::new();
        let mut block = Block::default();
        let mut skip_depth = 0usize; // > 0 inside a dropped subtree
        let mut link_depth = 0usize;
        for edge in page.tree.root().traverse() {
            match edge {
                Edge::Open(node) => match node.value() {
                    Node::Element(element) => {
                        if skip_depth > 0 || is_boilerplate(element) {
                            skip_depth += 1;
                        } else if BLOCK_ELEMENTS.contains(&element.name()) {
                            self.flush(&mut block, &mut blocks);
                        } else if element.name() == "a" {
                            link_depth += 1;
                        }
                    }
                    Node::Text(text) if skip_depth == 0 => {
                        let mut previous_space = block.text.ends_with(' ') || block.text.is_empty();
                        for c in text.chars() {
                            if c.is_whitespace() {
                                if !previous_space {
                                    block.text.push(' ');
                                    previous_space = true;
                                }
                            } else {
                                block.text.push(c);
                                previous_space = false;
                                if link_depth > 0 {
                                    block.link_chars += 1;
                                }
                            }
                        }
                    }
                    _ => {}
                },
                Edge::Close(node) => {
                    if let Node::Element(element) = node.value() {
                        if skip_depth > 0 {
                            skip_depth -= 1;
                        } else if BLOCK_ELEMENTS.contains(&element.name()) {
                            self.flush(&mut block, &mut blocks);
                        } else if element.name() == "a" {
                            link_depth = link_depth.saturating_sub(1);
                        }
                    }
                }
            }
        }
        self.flush(&mut block, &mut blocks);
        blocks.join("\n")
    }

    fn flush(&self, block: &mut Block, blocks: &mut Vec<String>) {
        let taken = std::mem::take(block);
        let text = taken.text.trim();
        if text.is_empty() {
            return;
        }
        let chars = text.chars().filter(|c| !c.is_whitespace()).count().max(1);
        let density = taken.link_chars as f64 / chars as f64;
        if density > self.file.max_link_density {
            return;
        }
        if taken.link_chars > 0 && text.split_whitespace().count() < self.file.min_block_words {
            return;
        }
        blocks.push(text.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"<!doctype html><html><head><title>T</title><style>p{color:red}</style>
        <script>var tracking = 1;</script></head><body>
        <nav><a href="/">Home</a> <a href="/about">About</a></nav>
        <div class="site-header">Site name banner</div>
        <article><h1>The heading</h1>
        <p>First paragraph of the <a href="/x">article</a> body text.</p>
        <p>Second   paragraph,
           spread over lines.</p>
        <ul class="links"><li><a href="/a">Link one</a></li><li><a href="/b">Link two</a></li></ul>
        </article>
        <div id="cookie-banner">We use cookies.</div>
        <footer>Copyright 2024</footer></body></html>"#;

    fn extractor() -> Extractor {
        ExtractFile::default().validate().unwrap()
    }

    #[test]
    fn keeps_main_text_one_block_per_line() {
        let text = extractor().extract(PAGE);
        assert_eq!(
            text,
            "The heading\nFirst paragraph of the article body text.\nSecond paragraph, spread over lines."
        );
    }

    #[test]
    fn drops_scripts_styles_navigation_and_boilerplate() {
        let text = extractor().extract(PAGE);
        for gone in [
            "tracking",
            "color:red",
            "Home",
            "Site name",
            "cookies",
            "Copyright",
            "Link one",
        ] {
            assert!(!text.contains(gone), "{gone} survived: {text}");
        }
    }

    #[test]
    fn empty_pages_are_removed_and_plain_documents_pass() {
        let mut doc = Document::plain("d", "<html><body><nav>menu</nav></body></html>", "s");
        doc.metadata.content_type = ContentType::Html;
        assert!(matches!(
            extractor().apply(doc),
            Verdict::Drop(_, DropReason::ExtractionEmpty)
        ));
        let plain = Document::plain("d", "<b>not html</b>", "s");
        match extractor().apply(plain) {
            Verdict::Keep(doc) => assert_eq!(doc.text, "<b>not html</b>"),
            Verdict::Drop(..) => panic!("plain text must pass"),
        }
    }
}
