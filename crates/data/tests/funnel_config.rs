//! The documented example config (`configs/funnel.example.toml`) stays valid: it parses with
//! unknown keys rejected, every stage validates, and the mixture matches the sources.

use std::path::Path;

use stoke_data::funnel::FunnelFile;

#[test]
fn example_config_parses_and_every_stage_validates() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/funnel.example.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let file = FunnelFile::parse(&text).unwrap();
    assert_eq!(file.sources.len(), 2);
    assert_eq!(file.stages.len(), 12);
    let names: Vec<String> = file.sources.iter().map(|s| s.name.clone()).collect();
    let mixture = file.mixture.clone().unwrap().validate(&names).unwrap();
    assert!((mixture.sources.iter().map(|s| s.weight).sum::<f64>() - 1.0).abs() < 1e-12);
    let dir = path.parent().unwrap();
    let tokenize = file.tokenize.clone().unwrap().validate(dir).unwrap();
    assert_eq!(tokenize.end_of_text, "<|endoftext|>");
    let kinds: Vec<&str> = file
        .stages
        .into_iter()
        .map(|s| s.validate(dir).unwrap().name())
        .collect();
    assert_eq!(kinds.first(), Some(&"extract"));
    assert_eq!(kinds.last(), Some(&"line_dedup"));
}
