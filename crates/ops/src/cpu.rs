//! The vector instruction level the hand-written CPU kernels run at, detected once per process.
//!
//! Three levels, from the widest down:
//! - `Avx512`: AVX-512F (+ FMA): 16 f32 lanes, 32 vector registers (Intel Skylake-SP and later
//!   servers, AMD Zen 4/5);
//! - `Avx2`: AVX2 + FMA: 8 f32 lanes, 16 vector registers (AMD Zen 1-3, Intel Haswell and later
//!   client cores: most laptops and many cloud machines);
//! - `Baseline`: what the compilation target guarantees (SSE2 on x86-64), plain loops.
//!
//! `STOKE_SIMD=avx512|avx2|baseline` lowers the level (tests and benchmarks use it to run a
//! narrower kernel on a wider CPU); a level the CPU lacks is never chosen, whatever is asked.
//! The bf16 GEMM keeps its own choice on top of this (`bf16::backend`: AMX and `vdpbf16ps` are
//! separate features).
//!
//! What it is not: a general feature registry. Each kernel module matches on `Level` in one
//! place and keeps a portable loop that every level can fall back to.

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Baseline,
    Avx2,
    Avx512,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Avx512 => "avx512",
            Level::Avx2 => "avx2",
            Level::Baseline => "baseline",
        }
    }
}

/// The widest level this CPU supports, ignoring `STOKE_SIMD`.
pub fn detected() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        let fma = is_x86_feature_detected!("fma");
        if fma && is_x86_feature_detected!("avx512f") {
            return Level::Avx512;
        }
        if fma && is_x86_feature_detected!("avx2") {
            return Level::Avx2;
        }
    }
    Level::Baseline
}

/// The level in use: `detected()`, lowered by `STOKE_SIMD` when set.
pub fn level() -> Level {
    static CHOSEN: OnceLock<Level> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let wanted = match std::env::var("STOKE_SIMD").as_deref() {
            Ok("avx512") => Level::Avx512,
            Ok("avx2") => Level::Avx2,
            Ok("baseline") | Ok("portable") => Level::Baseline,
            _ => Level::Avx512,
        };
        wanted.min(detected())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_in_use_is_never_above_the_cpu() {
        assert!(level() <= detected());
        eprintln!(
            "vector level: {} (cpu: {})",
            level().name(),
            detected().name()
        );
    }
}
