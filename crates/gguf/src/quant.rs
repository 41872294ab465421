//! ggml tensor types: block layouts, dequantization to f32 and the quantizers `stoke export
//! --gguf` writes with (F32, F16, BF16, Q8_0).
//!
//! The block formats follow ggml's `ggml-quants.c` (`dequantize_row_*`, `quantize_row_q8_0_ref`);
//! tests check every reader against gguf-py's numpy dequantizers on fixture blocks. Written by
//! hand rather than through candle's quantized module, because that one reinterprets the file's
//! bytes as block structs in place, which needs aligned data that a GGUF does not promise.

use half::{bf16, f16};
use rayon::prelude::*;

/// Types stoke reads, for error messages.
pub const SUPPORTED: &str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";

/// A ggml tensor type, by its GGUF code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    /// A type stoke does not read; the code and ggml's name are kept for the error.
    Other(u32),
}

const OTHER_NAMES: &[(u32, &str)] = &[
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
];

impl GgmlType {
    pub fn from_code(code: u32) -> GgmlType {
        match code {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::BF16,
            other => GgmlType::Other(other),
        }
    }

    pub fn code(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::BF16 => 30,
            GgmlType::Other(code) => code,
        }
    }

    /// (values per block, bytes per block), or None for a type stoke does not read.
    pub fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
            GgmlType::Other(_) => return None,
        })
    }

    /// The `general.file_type` llama.cpp writes for a model stored mostly in this type.
    pub fn file_type(self) -> Option<u32> {
        Some(match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q8_0 => 7,
            GgmlType::BF16 => 32,
            _ => return None,
        })
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Other(code) => {
                return match OTHER_NAMES.iter().find(|(c, _)| c == code) {
                    Some((_, name)) => write!(f, "{name}"),
                    None => write!(f, "unknown type {code}"),
                };
            }
        };
        f.write_str(name)
    }
}

fn half_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Dequantizes `elements` values of type `dtype` from `bytes` (exactly their size).
pub fn dequantize(dtype: GgmlType, bytes: &[u8], elements: usize) -> Result<Vec<f32>, String> {
    let Some((block, size)) = dtype.block() else {
        return Err(format!(
            "type {dtype} cannot be read (supported: {SUPPORTED})"
        ));
    };
    if !elements.is_multiple_of(block) || bytes.len() != elements / block * size {
        return Err(format!(
            "{} bytes do not hold {elements} values of type {dtype}",
            bytes.len()
        ));
    }
    let mut out = vec![0f32; elements];
    // Work in chunks of whole blocks, a few thousand values each, across the thread pool.
    let blocks_per_chunk = (4096 / block).max(1);
    out.par_chunks_mut(block * blocks_per_chunk)
        .zip(bytes.par_chunks(size * blocks_per_chunk))
        .for_each(|(ys, xs)| {
            for (y, x) in ys.chunks_exact_mut(block).zip(xs.chunks_exact(size)) {
                dequantize_block(dtype, x, y);
            }
        });
    Ok(out)
}

fn dequantize_block(dtype: GgmlType, x: &[u8], y: &mut [f32]) {
    match dtype {
        GgmlType::F32 => y[0] = f32::from_le_bytes([x[0], x[1], x[2], x[3]]),
        GgmlType::F16 => y[0] = half_at(x, 0),
        GgmlType::BF16 => y[0] = bf16::from_le_bytes([x[0], x[1]]).to_f32(),
        GgmlType::Q4_0 => {
            let d = half_at(x, 0);
            let qs = &x[2..18];
            for j in 0..16 {
                y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
                y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
            }
        }
        GgmlType::Q4_1 => {
            let (d, m) = (half_at(x, 0), half_at(x, 2));
            let qs = &x[4..20];
            for j in 0..16 {
                y[j] = (qs[j] & 0x0F) as f32 * d + m;
                y[j + 16] = (qs[j] >> 4) as f32 * d + m;
            }
        }
        GgmlType::Q5_0 => {
            let d = half_at(x, 0);
            let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
            let qs = &x[6..22];
            for j in 0..16 {
                let h0 = ((qh >> j) << 4) & 0x10;
                let h1 = (qh >> (j + 12)) & 0x10;
                y[j] = ((u32::from(qs[j] & 0x0F) | h0) as i32 - 16) as f32 * d;
                y[j + 16] = ((u32::from(qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
            }
        }
        GgmlType::Q5_1 => {
            let (d, m) = (half_at(x, 0), half_at(x, 2));
            let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
            let qs = &x[8..24];
            for j in 0..16 {
                let h0 = ((qh >> j) << 4) & 0x10;
                let h1 = (qh >> (j + 12)) & 0x10;
                y[j] = (u32::from(qs[j] & 0x0F) | h0) as f32 * d + m;
                y[j + 16] = (u32::from(qs[j] >> 4) | h1) as f32 * d + m;
            }
        }
        GgmlType::Q8_0 => {
            let d = half_at(x, 0);
            for (v, &q) in y.iter_mut().zip(&x[2..34]) {
                *v = f32::from(q as i8) * d;
            }
        }
        GgmlType::Q4K => {
            let (d, dmin) = (half_at(x, 0), half_at(x, 2));
            let scales = &x[4..16];
            let qs = &x[16..144];
            for (n, (ys, q)) in y.chunks_exact_mut(64).zip(qs.chunks_exact(32)).enumerate() {
                let (sc1, m1) = scale_min_k4(2 * n, scales);
                let (sc2, m2) = scale_min_k4(2 * n + 1, scales);
                let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
                for l in 0..32 {
                    ys[l] = d1 * (q[l] & 0x0F) as f32 - m1;
                    ys[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
                }
            }
        }
        GgmlType::Q5K => {
            let (d, dmin) = (half_at(x, 0), half_at(x, 2));
            let scales = &x[4..16];
            let qh = &x[16..48];
            let qs = &x[48..176];
            for (n, (ys, ql)) in y.chunks_exact_mut(64).zip(qs.chunks_exact(32)).enumerate() {
                let (sc1, m1) = scale_min_k4(2 * n, scales);
                let (sc2, m2) = scale_min_k4(2 * n + 1, scales);
                let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
                let (u1, u2) = (1u8 << (2 * n), 2u8 << (2 * n));
                for l in 0..32 {
                    let hi1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                    let hi2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                    ys[l] = d1 * ((ql[l] & 0x0F) + hi1) as f32 - m1;
                    ys[l + 32] = d2 * ((ql[l] >> 4) + hi2) as f32 - m2;
                }
            }
        }
        GgmlType::Q6K => {
            let d = half_at(x, 208);
            for half in 0..2 {
                let ql = &x[64 * half..64 * half + 64];
                let qh = &x[128 + 32 * half..128 + 32 * half + 32];
                let sc = &x[192 + 8 * half..192 + 8 * half + 8];
                let ys = &mut y[128 * half..128 * half + 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    let s = |k: usize| d * f32::from(sc[is + k] as i8);
                    ys[l] = s(0) * q1 as f32;
                    ys[l + 32] = s(2) * q2 as f32;
                    ys[l + 64] = s(4) * q3 as f32;
                    ys[l + 96] = s(6) * q4 as f32;
                }
            }
        }
        GgmlType::Other(_) => {}
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Encodes f32 values as one of the types stoke writes (F32, F16, BF16, Q8_0).
pub fn quantize(dtype: GgmlType, values: &[f32]) -> Result<Vec<u8>, String> {
    match dtype {
        GgmlType::F32 => Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        GgmlType::F16 => Ok(values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect()),
        GgmlType::BF16 => Ok(values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect()),
        GgmlType::Q8_0 => {
            if !values.len().is_multiple_of(32) {
                return Err(format!(
                    "{} values do not divide into Q8_0 blocks of 32",
                    values.len()
                ));
            }
            let mut out = vec![0u8; values.len() / 32 * 34];
            out.par_chunks_mut(34)
                .zip(values.par_chunks(32))
                .for_each(|(block, xs)| quantize_block_q8_0(xs, block));
            Ok(out)
        }
        other => Err(format!(
            "stoke does not write type {other} (writes F32, F16, BF16, Q8_0)"
        )),
    }
}

/// ggml's `quantize_row_q8_0_ref` for one block: d = max|x| / 127, q = round(x / d).
fn quantize_block_q8_0(xs: &[f32], block: &mut [u8]) {
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (q, &x) in block[2..].iter_mut().zip(xs) {
        *q = ((x * id).round() as i8) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_round_trip_is_within_half_a_step() {
        let xs: Vec<f32> = (0..64)
            .map(|i| ((i * 37) % 23) as f32 / 7.0 - 1.5)
            .collect();
        let bytes = quantize(GgmlType::Q8_0, &xs).unwrap();
        let back = dequantize(GgmlType::Q8_0, &bytes, xs.len()).unwrap();
        for (block, (a, b)) in xs.chunks(32).zip(back.chunks(32)).enumerate() {
            let step = a.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 0.5 * step * 1.01 + 1e-3 * step,
                    "block {block}: {x} vs {y}"
                );
            }
        }
    }

    #[test]
    fn sizes_are_checked_and_unknown_types_refused() {
        assert!(dequantize(GgmlType::Q8_0, &[0u8; 33], 32).is_err());
        assert!(dequantize(GgmlType::Q4K, &[0u8; 144], 32).is_err());
        let err = dequantize(GgmlType::Other(10), &[0u8; 84], 256).unwrap_err();
        assert!(err.contains("Q2_K"), "{err}");
        assert!(quantize(GgmlType::Q4_0, &[0.0; 32]).is_err());
        assert!(quantize(GgmlType::Q8_0, &[0.0; 31]).is_err());
    }
}
