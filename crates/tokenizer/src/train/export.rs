//! Writing a [`TrainedBpe`] as a Hugging Face tokenizer: the GPT-2 byte-to-character table, the
//! vocabulary and merges as ByteLevel strings, and the `Split` + `ByteLevel` pipeline that
//! GPT-4-style tokenizers (Llama 3, Qwen 2) use in their `tokenizer.json`.
//!
//! Invariant: every one of the 256 bytes is in the vocabulary, so any text encodes without an
//! unknown token and decoding inverts encoding byte for byte.

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::{TrainError, TrainedBpe};

/// GPT-2's reversible map from bytes to printable characters (what `ByteLevel` uses): printable
/// Latin-1 bytes map to themselves, the other 68 to U+0100 upwards in byte order.
pub fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next_extra = 256u32;
    for byte in 0..=255u8 {
        let printable = matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            u32::from(byte)
        } else {
            let code = next_extra;
            next_extra += 1;
            code
        };
        table[byte as usize] = char::from_u32(code).unwrap_or('\u{FFFD}');
    }
    table
}

/// The ByteLevel string of a token's bytes.
pub(crate) fn token_string(bytes: &[u8]) -> String {
    let table = byte_to_char();
    bytes.iter().map(|&b| table[b as usize]).collect()
}

/// A tokenizer with the Split + ByteLevel pre-tokenizer and decoder and an empty BPE model.
pub(crate) fn empty_pipeline(pattern: &str) -> Result<Tokenizer, TrainError> {
    with_pipeline(BPE::default(), pattern)
}

fn with_pipeline(model: BPE, pattern: &str) -> Result<Tokenizer, TrainError> {
    let split = Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| TrainError::Pattern(e.to_string()))?;
    let pre_tokenizer = Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
    ]);
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    Ok(tokenizer)
}

pub(crate) fn to_hf(bpe: &TrainedBpe) -> Result<Tokenizer, TrainError> {
    let mut vocab: ahash::AHashMap<String, u32> = ahash::AHashMap::with_capacity(bpe.vocab_size());
    for (id, bytes) in bpe.vocab.iter().enumerate() {
        vocab.insert(token_string(bytes), id as u32);
    }
    for (i, special) in bpe.special_tokens.iter().enumerate() {
        vocab.insert(special.clone(), (bpe.vocab.len() + i) as u32);
    }
    let merges = bpe.merge_strings();
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| TrainError::Tokenizers(e.to_string()))?;
    let mut tokenizer = with_pipeline(model, &bpe.pattern)?;
    let specials: Vec<AddedToken> = bpe
        .special_tokens
        .iter()
        .map(|s| AddedToken::from(s.clone(), true))
        .collect();
    tokenizer.add_special_tokens(&specials);
    Ok(tokenizer)
}
