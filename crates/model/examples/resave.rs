//! Loads a Hugging Face checkpoint and saves it again with stoke (f32 safetensors, config.json,
//! generation_config.json, tokenizer files), so transformers can check the saved copy:
//!
//!     cargo run -p stoke-model --example resave -- SRC DST
//!     $VENV/bin/python scripts/make_parity_fixtures.py --check-saved SRC DST

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    stoke_ops::numerics::init_compute_threads();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [src, dst] = args.as_slice() else {
        eprintln!("usage: resave SRC_DIR DST_DIR");
        return ExitCode::from(2);
    };
    let (src, dst) = (PathBuf::from(src), PathBuf::from(dst));
    let model = match stoke_model::Transformer::load(&src, &candle_core::Device::Cpu) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = model.save_with_tokenizer(&dst, Some(&src)) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "saved {} ({} parameters, {}) to {}",
        src.display(),
        model.config().num_parameters(),
        model.config().architecture.hf_class_name(),
        dst.display()
    );
    ExitCode::SUCCESS
}
