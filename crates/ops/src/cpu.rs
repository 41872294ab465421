//! The vector instruction level the hand-written CPU kernels run at, detected once per process.
//!
//! Three levels, from the widest down: `Avx512` (AVX-512F + FMA: 16 f32 lanes, 32 vector
//! registers), `Avx2` (AVX2 + FMA: 8 lanes, 16 registers) and `Baseline` (what the compilation
//! target guarantees, plain loops). `STOKE_SIMD=avx512|avx2|baseline` lowers the level (tests and
//! benchmarks use it to run a narrower kernel on a wider CPU); a level the CPU lacks is never
//! chosen, whatever is asked.
//!
//! What it is not: where the level is chosen. `crate::dispatch`, the one CPU dispatch point,
//! detects it and reads `STOKE_SIMD`; this module keeps the path `cpu::{Level, level, detected}`
//! the kernels match on. Each kernel module matches on `Level` in one place and keeps a portable
//! loop that every level can fall back to.

pub use crate::dispatch::{Level, detected, level};

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
