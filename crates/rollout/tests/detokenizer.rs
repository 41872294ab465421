//! Regression: `stoke generate` on the qwen2 fixture failed with "token id 298 is not in the
//! vocabulary" because the model's embedding has 300 rows and its tokenizer 295 tokens. Ids the
//! tokenizer does not know decode to no text (as Hugging Face's decoders do); known ids around
//! them still decode.

use std::path::PathBuf;

use stoke_rollout::Detokenizer;
use stoke_tokenizer::hf::Tokenizer;

#[test]
fn ids_past_the_tokenizer_vocabulary_decode_to_no_text() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied");
    let tokenizer = Tokenizer::from_dir(&dir).expect("fixture tokenizer loads");
    let known = tokenizer.encode("Hello", false).expect("encodes");
    let unknown = tokenizer.vocab_size() as u32 + 3;
    assert!(
        tokenizer.id_to_token(unknown).is_none(),
        "id {unknown} must be outside the vocabulary"
    );

    let mut with_unknown = known.clone();
    with_unknown.insert(1, unknown);
    with_unknown.push(unknown);
    let text = Detokenizer::decode(&tokenizer, &with_unknown).expect("decodes");
    assert_eq!(text, "Hello");
}
