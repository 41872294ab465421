//! A vectorizable f32 `exp` for the elementwise kernels (attention softmax, SwiGLU).
//!
//! Why: the kernels called libm's scalar `expf` per element; on the SmolLM2-135M training
//! step the attention softmax alone (8 x 9 x 256 x 256 scores per layer) took 22 ms of a 27 ms
//! attention forward. Here `exp` is a branch-free polynomial (Cephes `expf`: range reduction
//! by `ln 2` in two parts, a degree-6 polynomial, the exponent put in by integer addition),
//! compiled for AVX-512 or AVX2 + FMA (chosen at run time) and for the baseline target, so
//! LLVM turns each loop into 16-, 8- (or 4-) wide vector code.
//!
//! Accuracy: within 2 ulp of the correctly rounded value over the whole range (tested against
//! f64 `exp`); `exp(x) = 0` exactly below -87.3 (so masked scores stay exact zeros), `+inf`
//! above 88.7, NaN stays NaN. What it is not: used for log-probabilities (`row_logsumexp`
//! keeps libm, so the f32 log-prob values the trainer and rollout compare are unchanged).
#![allow(unsafe_code)]

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this exp underflows to (at most) a denormal: returned as exactly 0.
const LO: f32 = -87.336_55;
/// Above this exp overflows: returned as +inf.
const HI: f32 = 88.722_84;
/// 1.5 * 2^23: adding and subtracting it rounds to the nearest integer (|v| < 2^22).
const ROUND: f32 = 12_582_912.0;

/// `exp(x)` in f32, branch-free (vectorizes inside a loop).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let xc = x.clamp(LO, HI);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let r2 = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let p = p * r2 + r + 1.0;
    // n in [-126, 128]: 2^n by building the exponent field (n = 128 only at x = HI, where
    // p * 2^127 * 2 is taken as two steps to stay finite until the final multiply).
    let ni = n as i32;
    let half = ni >> 1;
    let scale_a = f32::from_bits(((half + 127) as u32) << 23);
    let scale_b = f32::from_bits(((ni - half + 127) as u32) << 23);
    let y = p * scale_a * scale_b;
    let y = if x < LO { 0.0 } else { y };
    let y = if x > HI { f32::INFINITY } else { y };
    if x.is_nan() { x } else { y }
}

/// `sigmoid(x) = 1 / (1 + exp(-x))` with `exp` above.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Runs `f` compiled for AVX-512 when the CPU has it, else for AVX2 + FMA (most x86-64 CPUs
/// since 2013-2015 without AVX-512: AMD Zen 1-3, Intel client cores), else for the baseline
/// target. Pass `f` as `#[inline(always)] || ...`: only code inlined into the target-feature
/// function is compiled for its instructions, and `f` has three call sites here, so without the
/// attribute the compiler keeps a large closure out of line, compiled for the baseline target
/// (measured: SwiGLU's backward, the attention softmax and RMSNorm's backward ran in SSE code
/// that way, about 5% of a bf16 training step at SmolLM2-135M's shapes).
#[inline(always)]
pub fn dispatch<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        match crate::cpu::level() {
            // SAFETY: the CPU supports AVX-512F and FMA (checked by `cpu::level`).
            crate::cpu::Level::Avx512 => return unsafe { with_avx512(f) },
            // SAFETY: the CPU supports AVX2 and FMA (checked by `cpu::level`).
            crate::cpu::Level::Avx2 => return unsafe { with_avx2(f) },
            crate::cpu::Level::Baseline => {}
        }
    }
    f()
}

/// # Safety
/// The CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// # Safety
/// The CPU supports AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `xs[i] = exp(xs[i])`; returns the sum of the results (in 16 lanes, then added).
pub fn exp_in_place_sum(xs: &mut [f32]) -> f32 {
    dispatch(
        #[inline(always)]
        || {
            let mut lanes = [0.0f32; 16];
            let mut chunks = xs.chunks_exact_mut(16);
            for chunk in &mut chunks {
                for (lane, v) in lanes.iter_mut().zip(chunk.iter_mut()) {
                    *v = exp(*v);
                    *lane += *v;
                }
            }
            let mut sum: f32 = 0.0;
            for v in chunks.into_remainder() {
                *v = exp(*v);
                sum += *v;
            }
            lanes.iter().sum::<f32>() + sum
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp_over_the_range() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x < 88.5 {
            let want = (x as f64).exp() as f32;
            let got = exp(x);
            worst = worst.max(ulps(got, want));
            x += 0.000_73;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
    }

    #[test]
    fn edges_are_exact() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::MIN), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(88.5).is_finite());
    }

    #[test]
    fn the_dispatched_loop_matches_the_scalar_function() {
        let mut xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.15).collect();
        let want: Vec<f32> = xs.iter().map(|&x| exp(x)).collect();
        let sum = exp_in_place_sum(&mut xs);
        assert_eq!(xs, want);
        let direct: f64 = want.iter().map(|&v| v as f64).sum();
        assert!((sum as f64 - direct).abs() <= 1e-5 * direct);
    }
}
