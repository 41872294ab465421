//! stoke-optim: optimizers (AdamW, Muon), learning-rate and batch-size schedules, gradient
//! clipping. Works on named parameters (`candle_core::Var`) and their gradients only; it knows no
//! model, no data and no files beyond its own state format.
