//! 8-bit AdamW moments: blockwise-scaled 8-bit floats with stochastic rounding.
//!
//! Why: AdamW's two f32 moments are 8 bytes per parameter, twice the weights. For a 1B-class
//! model that is 9.9 GB, which with f32 weights and gradients (another 9.9 GB) leaves no room on
//! a 24 GB machine. In 8 bits the moments take 2 bytes per parameter (plus one f32 scale per
//! block of 256), a quarter (bitsandbytes' 8-bit optimizers are the known precedent; this is
//! stoke's own format, not theirs).
//!
//! Format: each block of `BLOCK` consecutive elements keeps its largest magnitude as an f32
//! scale, and every element `x / scale` as one byte:
//! - first moment (signed): sign bit, 4 exponent bits, 3 mantissa bits (`E4M3`), magnitudes
//!   down to 2^-17 of the block's largest (subnormals below 2^-14);
//! - second moment (non-negative): 5 exponent bits, 3 mantissa bits (`E5M3`), down to 2^-33.
//!
//! Relative spacing is 1/8 to 1/16 of an octave. Rounding is stochastic (round up with
//! probability equal to the fraction past the lower grid point): the stored moment is unbiased,
//! so small per-step changes (beta2 = 0.999 moves v by 0.1%) accumulate in expectation instead
//! of being rounded away every step, which round-to-nearest would do. The random bits come from
//! a xorshift stream per (seed, step, block): deterministic, so a resumed run repeats them exactly. A
//! positive second moment below the smallest code rounds up to it, never to zero (a zero `v`
//! under a nonzero `m` would turn the step into `m / eps`).
//!
//! What it is not: bitsandbytes-compatible (state files are stoke's), nor used for Muon's
//! momentum. Invariants: dequantize(quantize(x)) is within one grid step of x; `len` elements,
//! `ceil(len / BLOCK)` scales.

use rayon::prelude::*;

/// Elements per scale.
pub(crate) const BLOCK: usize = 256;

/// One parameter's 8-bit AdamW moments.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Int8Moments {
    pub exp_avg: Vec<u8>,
    pub exp_avg_scale: Vec<f32>,
    pub exp_avg_sq: Vec<u8>,
    pub exp_avg_sq_scale: Vec<f32>,
}

impl Int8Moments {
    pub fn zeros(len: usize) -> Self {
        let blocks = len.div_ceil(BLOCK);
        Int8Moments {
            exp_avg: vec![0; len],
            exp_avg_scale: vec![0.0; blocks],
            exp_avg_sq: vec![0; len],
            exp_avg_sq_scale: vec![0.0; blocks],
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.exp_avg.len() + self.exp_avg_sq.len() + 4 * (2 * self.exp_avg_scale.len())
    }
}

/// An 8-bit float layout: `exponent_bits` exponent bits, 3 mantissa bits, and a sign bit when
/// `signed`. Values are magnitudes in [0, 1.875]; the largest exponent field means 2^0.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Code {
    exponent_bits: u32,
    signed: bool,
}

pub(crate) const E4M3: Code = Code {
    exponent_bits: 4,
    signed: true,
};
pub(crate) const E5M3: Code = Code {
    exponent_bits: 5,
    signed: false,
};

const MANTISSA_BITS: u32 = 3;

impl Code {
    /// Exponent bias: the largest exponent field `2^e - 1` means 2^0.
    fn bias(self) -> i32 {
        (1 << self.exponent_bits) - 1
    }

    /// The magnitude of the unsigned part `bits` (exponent and mantissa fields).
    fn magnitude(self, bits: u32) -> f32 {
        let e = (bits >> MANTISSA_BITS) as i32;
        let m = (bits & 7) as f32;
        if e == 0 {
            (m / 8.0) * 2f32.powi(1 - self.bias())
        } else {
            (1.0 + m / 8.0) * 2f32.powi(e - self.bias())
        }
    }

    /// Every code's value (for decoding by lookup).
    pub fn table(self) -> [f32; 256] {
        let mut table = [0.0f32; 256];
        for (code, slot) in table.iter_mut().enumerate() {
            let code = code as u32;
            *slot = if self.signed {
                let magnitude = self.magnitude(code & 0x7f);
                if code & 0x80 != 0 {
                    -magnitude
                } else {
                    magnitude
                }
            } else {
                self.magnitude(code)
            };
        }
        table
    }

    /// `y` (|y| <= 1) as a code, rounded stochastically with `random` (uniform 32 bits): up to
    /// the next grid point with probability equal to the fraction past the lower one.
    pub fn encode(self, y: f32, random: u32, round_up_from_zero: bool) -> u8 {
        let magnitude = y.abs().min(1.0);
        let sign = if self.signed && y < 0.0 { 0x80 } else { 0 };
        // Smallest normal magnitude of the code: 2^(1 - bias), built from its bits.
        let min_normal = f32::from_bits(((128 - self.bias()) as u32) << 23);
        let bits = if magnitude >= min_normal {
            // Stochastic truncation of the f32 mantissa to 3 bits: add random low bits, cut.
            let raw = magnitude.to_bits();
            let dropped = 23 - MANTISSA_BITS;
            let noise = random >> (32 - dropped);
            let rounded = (raw + noise) >> dropped; // exponent and 3 mantissa bits
            let f32_exponent = (rounded >> MANTISSA_BITS) as i32 - 127;
            let e = f32_exponent + self.bias();
            ((e as u32) << MANTISSA_BITS) | (rounded & 7)
        } else {
            // Subnormal grid: steps of min_normal / 8.
            let q = magnitude / (min_normal / 8.0);
            let floor = q.floor();
            let up = ((random >> 8) as f32) * (1.0 / (1u32 << 24) as f32) < q - floor;
            let steps = floor as u32 + u32::from(up);
            if steps == 0 && round_up_from_zero && magnitude > 0.0 {
                1
            } else {
                steps
            }
        };
        (bits as u8) | sign
    }
}

/// splitmix64 of (seed, index): the stochastic-rounding bits of one element.
fn random_bits(seed: u64, index: u64) -> u32 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

/// Decoded values of one block of codes.
fn decode_block(codes: &[u8], scale: f32, table: &[f32; 256], out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = table[c as usize] * scale;
    }
}

/// `out.len()` pseudo-random words of one block: xorshift64* seeded by splitmix64 of
/// (seed, block), one multiply per element; the low half rounds `m`, the high half `v`.
fn block_random(seed: u64, block: u64, out: &mut [u64]) {
    let mut state =
        u64::from(random_bits(seed, block)) << 32 | u64::from(random_bits(!seed, block));
    state |= 1; // never the all-zero state
    for r in out.iter_mut() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        *r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
    }
}

/// Encodes `values` into `codes` with a fresh block scale (returned), rounding with `random`
/// (one word per element).
fn encode_block(
    values: &[f32],
    code: Code,
    random: impl Fn(usize) -> u32,
    codes: &mut [u8],
    round_up_from_zero: bool,
) -> f32 {
    let scale = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if scale == 0.0 || !scale.is_finite() {
        // All zero, or non-finite (the update is then skipped upstream; keep zeros, no NaN).
        codes.fill(0);
        return if scale.is_finite() { 0.0 } else { scale };
    }
    let inverse = 1.0 / scale;
    for (i, (c, &v)) in codes.iter_mut().zip(values).enumerate() {
        *c = code.encode(v * inverse, random(i), round_up_from_zero);
    }
    scale
}

/// The per-element AdamW arithmetic of `adamw::adamw_update` on 8-bit moments: each block is
/// decoded, updated and re-encoded (stochastic rounding seeded by `seed`).
pub(crate) fn adamw_update_int8(
    param: &mut [f32],
    grad: &[f32],
    state: &mut Int8Moments,
    s: &crate::adamw::AdamWScalars,
    seed: u64,
) {
    let (m_table, v_table) = (E4M3.table(), E5M3.table());
    let s = *s;
    param
        .par_chunks_mut(BLOCK)
        .zip(grad.par_chunks(BLOCK))
        .zip(state.exp_avg.par_chunks_mut(BLOCK))
        .zip(state.exp_avg_scale.par_iter_mut())
        .zip(state.exp_avg_sq.par_chunks_mut(BLOCK))
        .zip(state.exp_avg_sq_scale.par_iter_mut())
        .enumerate()
        .for_each(|(block, (((((p, g), mc), ms), vc), vs))| {
            let n = p.len();
            let (mut m, mut v) = ([0.0f32; BLOCK], [0.0f32; BLOCK]);
            decode_block(mc, *ms, &m_table, &mut m[..n]);
            decode_block(vc, *vs, &v_table, &mut v[..n]);
            for i in 0..n {
                let (m, v) = (&mut m[i], &mut v[i]);
                let g = g[i];
                *m += s.one_minus_beta1 * (g - *m);
                *v = *v * s.beta2 + s.one_minus_beta2 * g * g;
                let denom = v.sqrt() / s.bias_correction2_sqrt + s.eps;
                p[i] = p[i] * s.decay - s.step_size * (*m / denom);
            }
            let mut random = [0u64; BLOCK];
            block_random(seed, block as u64, &mut random[..n]);
            *ms = encode_block(&m[..n], E4M3, |i| random[i] as u32, mc, false);
            *vs = encode_block(&v[..n], E5M3, |i| (random[i] >> 32) as u32, vc, true);
        });
}

/// The f32 values of 8-bit moments (for tests and inspection).
#[cfg(test)]
pub(crate) fn decode(codes: &[u8], scales: &[f32], code: Code) -> Vec<f32> {
    let table = code.table();
    let mut out = vec![0.0; codes.len()];
    for ((o, c), &s) in out.chunks_mut(BLOCK).zip(codes.chunks(BLOCK)).zip(scales) {
        decode_block(c, s, &table, o);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_monotone_and_end_at_one() {
        for code in [E4M3, E5M3] {
            let table = code.table();
            let limit = if code.signed { 128 } else { 256 };
            let magnitudes = &table[..limit];
            assert_eq!(magnitudes[0], 0.0);
            assert!(magnitudes.windows(2).all(|w| w[0] < w[1]), "{code:?}");
            let top = (((1 << code.exponent_bits) - 1) << 3) as usize;
            assert_eq!(magnitudes[top], 1.0, "{code:?}");
        }
        assert_eq!(E4M3.table()[0x80 | 0x40], -E4M3.table()[0x40]);
    }

    /// Rounding lands on one of the two neighbouring grid points, and on average on the value.
    #[test]
    fn stochastic_rounding_is_unbiased_and_within_one_step() {
        for (code, values) in [
            (E4M3, vec![0.7f32, -0.33, 1e-3, -2.2e-5, 3e-6, 1.0]),
            (E5M3, vec![0.999f32, 0.5001, 1e-7, 3e-10, 1.0]),
        ] {
            let table = code.table();
            for &y in &values {
                let trials = 20_000u64;
                let mut sum = 0.0f64;
                for t in 0..trials {
                    let decoded = table[code.encode(y, random_bits(7, t), false) as usize];
                    let (lo, hi) = neighbours(&table, code, y);
                    assert!(
                        decoded == lo || decoded == hi,
                        "{code:?} {y}: {decoded} not in [{lo}, {hi}]"
                    );
                    sum += f64::from(decoded);
                }
                let mean = sum / trials as f64;
                let (lo, hi) = neighbours(&table, code, y);
                let tolerance = 4.0 * f64::from(hi - lo) / (trials as f64).sqrt() + 1e-12;
                assert!(
                    (mean - f64::from(y)).abs() <= tolerance,
                    "{code:?} {y}: mean {mean}"
                );
            }
        }
    }

    fn neighbours(table: &[f32; 256], code: Code, y: f32) -> (f32, f32) {
        let limit = if code.signed { 128 } else { 256 };
        let magnitude = y.abs();
        let mags = &table[..limit];
        let hi_index = mags.iter().position(|&m| m >= magnitude).expect("in range");
        let lo = if mags[hi_index] == magnitude {
            magnitude
        } else {
            mags[hi_index - 1]
        };
        let (lo, hi) = (lo, mags[hi_index]);
        if y < 0.0 { (-hi, -lo) } else { (lo, hi) }
    }

    #[test]
    fn a_positive_second_moment_never_rounds_to_zero() {
        let tiny = 1e-15f32;
        for t in 0..1000 {
            assert_ne!(E5M3.encode(tiny, random_bits(3, t), true), 0);
        }
        assert_eq!(E5M3.encode(0.0, 12345, true), 0);
    }

    #[test]
    fn blocks_round_trip_within_one_grid_step() {
        let values: Vec<f32> = (0..1000)
            .map(|i| ((i as f32) * 0.37).sin() * 10f32.powi(-(i % 5)))
            .collect();
        let mut codes = vec![0u8; values.len()];
        let mut scales = Vec::new();
        for (b, (chunk, out)) in values
            .chunks(BLOCK)
            .zip(codes.chunks_mut(BLOCK))
            .enumerate()
        {
            let mut random = [0u64; BLOCK];
            block_random(11, b as u64, &mut random[..chunk.len()]);
            scales.push(encode_block(chunk, E4M3, |i| random[i] as u32, out, false));
        }
        let decoded = decode(&codes, &scales, E4M3);
        for (b, chunk) in values.chunks(BLOCK).enumerate() {
            let scale = scales[b];
            for (i, &v) in chunk.iter().enumerate() {
                let d = decoded[b * BLOCK + i];
                // One step is at most 1/8 of the value's octave, or the subnormal spacing.
                let step = (v.abs() / 8.0).max(scale * 2f32.powi(-17));
                assert!((d - v).abs() <= step * 1.0001, "{v} -> {d} (step {step})");
            }
        }
    }
}
