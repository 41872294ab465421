//! IEEE half precision (f16) conversions for the Q8_0 scales, through the `half` crate (the
//! workspace's f16 type, also used by the GGUF reader), so every kernel path reads a scale as
//! the same f32.
//!
//! Invariants: `f16_to_f32` is exact (every f16 is an f32); `f32_to_f16` rounds to nearest,
//! ties to even, as `vcvtps2ph` with the default rounding mode and llama.cpp's
//! `GGML_FP32_TO_FP16` do; overflow gives infinity, NaN stays NaN (tested in `tests.rs`).

/// The f32 value of the f16 with bits `h`.
pub fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// The f16 bits nearest `x` (ties to even).
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}
