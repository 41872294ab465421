//! IEEE half precision (f16) conversions for the Q8_0 scales, in plain integer code so that
//! every kernel path (and a CPU without F16C) reads a scale as the same f32.
//!
//! What it is not: a half-precision number type (the `half` crate's); only the two conversions
//! the format needs. Invariants: `f16_to_f32` is exact (every f16 is an f32); `f32_to_f16`
//! rounds to nearest, ties to even, as `vcvtps2ph` with the default rounding mode and
//! llama.cpp's `GGML_FP32_TO_FP16` do; overflow gives infinity, NaN stays NaN.

/// The f32 value of the f16 with bits `h`.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    match exp {
        // Zero or subnormal: man * 2^-24, exact in f32.
        0 => f32::from_bits((man as f32 * f32::from_bits(0x3380_0000)).to_bits() | sign),
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (man << 13)),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

/// The bits of the f16 nearest `x` (ties to even).
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        // Infinity, or NaN kept quiet and non-zero.
        return sign
            | 0x7c00
            | if man != 0 {
                0x200 | (man >> 13) as u16
            } else {
                0
            };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // An f16 subnormal (or zero): the 24-bit significand shifted to units of 2^-24.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        // A carry into bit 10 is the smallest normal's encoding.
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        // A carry into the exponent is right, up to infinity.
        r += 1;
    }
    sign | r as u16
}
