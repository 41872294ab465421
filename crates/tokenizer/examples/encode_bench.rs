//! Encoding throughput: `cargo run --release -p stoke-tokenizer --example encode_bench -- \
//!   DIR/tokenizer.json CORPUS`. Encodes the corpus line by line with the `tokenizers` crate
//! (the runtime path of `stoke_tokenizer::hf`), once on one thread and once with
//! `encode_batch` on all threads, and prints MB/s and bytes per token.

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: encode_bench TOKENIZER_JSON CORPUS".into());
    }
    let tokenizer = tokenizers::Tokenizer::from_file(&args[1])?;
    let text = std::fs::read_to_string(&args[2])?;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let bytes = text.len() as f64;

    let started = Instant::now();
    let mut tokens = 0usize;
    for line in &lines {
        tokens += tokenizer.encode_fast(*line, false)?.len();
    }
    let single = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut batch_tokens = 0usize;
    for chunk in lines.chunks(10_000) {
        let encodings = tokenizer.encode_batch_fast(chunk.to_vec(), false)?;
        batch_tokens += encodings.iter().map(|e| e.len()).sum::<usize>();
    }
    let parallel = started.elapsed().as_secs_f64();
    assert_eq!(tokens, batch_tokens);
    println!(
        "{:.1} MB, {} tokens ({:.3} bytes/token): 1 thread {:.1} MB/s, batch on {} threads {:.1} MB/s",
        bytes / 1e6,
        tokens,
        bytes / tokens as f64,
        bytes / 1e6 / single,
        rayon::current_num_threads(),
        bytes / 1e6 / parallel
    );
    Ok(())
}
