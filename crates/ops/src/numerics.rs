//! CPU floating-point environment for compute threads: flush-to-zero (FTZ) and
//! denormals-are-zero (DAZ).
//!
//! Why: candle's gemm microkernels slow down about tenfold when operands or results are
//! subnormal, which happens routinely late in training (tiny gradients, Adam second moments).
//! Treating subnormals as zero costs nothing measurable in accuracy for f32 training.
//!
//! What it is: `init_compute_threads` sets FTZ/DAZ on the calling thread and on every thread
//! candle 0.11 computes on: rayon's global pool (candle's gemm and our kernels; built with a
//! `start_handler`, or, when some code already built it, reached with `rayon::broadcast`),
//! candle's own `BarrierPool` of persistent `candle-bp-N` threads (its elementwise and
//! broadcast binary/unary maps; reached with `BarrierPool::execute`, which runs a closure on
//! every worker), and candle's private rayon pool used by `Device::with_context`.
//! What it is not: it does not reach threads spawned elsewhere (tokio, `std::thread`); code
//! that computes on such threads calls `set_ftz_daz_on_this_thread` itself.
//!
//! Invariant for callers: call `init_compute_threads()` before the first candle operation
//! (the CLI does so first thing in `main`, tests call it at their start). Calling it again
//! is cheap and harmless.
//!
//! One of the two modules of stoke-ops that use `unsafe` (with allocator.rs): reading and writing the
//! floating-point control register needs inline assembly.
#![allow(unsafe_code)]

use std::sync::Once;

/// MXCSR bit 15: flush-to-zero (results that would be subnormal become zero).
#[cfg(target_arch = "x86_64")]
const MXCSR_FTZ: u32 = 1 << 15;
/// MXCSR bit 6: denormals-are-zero (subnormal inputs are read as zero).
#[cfg(target_arch = "x86_64")]
const MXCSR_DAZ: u32 = 1 << 6;
/// FPCR bit 24 on aarch64: FZ, which both flushes subnormal results and reads subnormal
/// inputs as zero (aarch64 has no separate DAZ bit).
#[cfg(target_arch = "aarch64")]
const FPCR_FZ: u64 = 1 << 24;

static GLOBAL_POOL: Once = Once::new();

/// Sets FTZ/DAZ on the calling thread and on every thread of rayon's global pool.
/// Idempotent; see the module docs for when to call it.
pub fn init_compute_threads() {
    set_ftz_daz_on_this_thread();
    GLOBAL_POOL.call_once(|| {
        // Process setup for training belongs here too: see allocator.rs (a ~20% faster
        // training step from not page-faulting the working set every step).
        crate::allocator::keep_freed_memory();
        let built = rayon::ThreadPoolBuilder::new()
            .start_handler(|_| set_ftz_daz_on_this_thread())
            .build_global();
        if built.is_err() {
            // The global pool already exists (something used rayon first): its threads live
            // for the whole process, so setting the flags on each of them once suffices.
            rayon::broadcast(|_| set_ftz_daz_on_this_thread());
        }
        // candle's persistent pools: their threads also live for the whole process.
        candle_core::utils::barrier_pool().execute(|_| set_ftz_daz_on_this_thread());
        candle_core::utils::with_threadpool(|| rayon::broadcast(|_| set_ftz_daz_on_this_thread()));
    });
}

/// Sets FTZ/DAZ on the calling thread only (no effect on architectures without them).
pub fn set_ftz_daz_on_this_thread() {
    #[cfg(target_arch = "x86_64")]
    {
        let csr = read_mxcsr() | MXCSR_FTZ | MXCSR_DAZ;
        write_mxcsr(csr);
    }
    #[cfg(target_arch = "aarch64")]
    {
        let fpcr = read_fpcr() | FPCR_FZ;
        write_fpcr(fpcr);
    }
}

/// Whether the calling thread flushes subnormals to zero (both FTZ and DAZ on x86_64,
/// FZ on aarch64). Always false on other architectures.
pub fn ftz_daz_enabled() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let csr = read_mxcsr();
        csr & MXCSR_FTZ != 0 && csr & MXCSR_DAZ != 0
    }
    #[cfg(target_arch = "aarch64")]
    {
        read_fpcr() & FPCR_FZ != 0
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
fn read_mxcsr() -> u32 {
    let mut csr: u32 = 0;
    // SAFETY: `stmxcsr` stores the 32-bit MXCSR register to the given address, which points
    // to a live, aligned, writable u32 on our stack; SSE is part of the x86_64 baseline.
    unsafe {
        core::arch::asm!(
            "stmxcsr [{ptr}]",
            ptr = in(reg) &mut csr as *mut u32,
            options(nostack, preserves_flags)
        );
    }
    csr
}

#[cfg(target_arch = "x86_64")]
fn write_mxcsr(csr: u32) {
    // SAFETY: `ldmxcsr` loads MXCSR from a live, aligned u32. We only ever write a value read
    // from MXCSR with the FTZ/DAZ bits added, so no reserved bit is set (which would fault)
    // and exception masks and rounding mode stay as they were.
    unsafe {
        core::arch::asm!(
            "ldmxcsr [{ptr}]",
            ptr = in(reg) &csr as *const u32,
            options(nostack, readonly, preserves_flags)
        );
    }
}

#[cfg(target_arch = "aarch64")]
fn read_fpcr() -> u64 {
    let fpcr: u64;
    // SAFETY: reading FPCR has no side effects and is allowed at EL0.
    unsafe {
        core::arch::asm!("mrs {v}, fpcr", v = out(reg) fpcr, options(nomem, nostack, preserves_flags));
    }
    fpcr
}

#[cfg(target_arch = "aarch64")]
fn write_fpcr(fpcr: u64) {
    // SAFETY: writing FPCR at EL0 is allowed; we write back the value just read with only
    // the FZ bit added, leaving rounding mode and trap enables unchanged.
    unsafe {
        core::arch::asm!("msr fpcr, {v}", v = in(reg) fpcr, options(nomem, nostack, preserves_flags));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn ftz_daz_is_set_on_main_thread_and_every_rayon_worker() {
        init_compute_threads();
        assert!(ftz_daz_enabled(), "calling thread lacks FTZ/DAZ");
        let per_worker: Vec<bool> = rayon::broadcast(|_| ftz_daz_enabled());
        assert_eq!(per_worker.len(), rayon::current_num_threads());
        assert!(per_worker.iter().all(|&on| on), "workers: {per_worker:?}");
    }

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn ftz_daz_is_set_on_candles_own_worker_pools() {
        init_compute_threads();
        let pool = candle_core::utils::barrier_pool();
        let flags = std::sync::Mutex::new(vec![false; pool.n_workers() + 1]);
        pool.execute(|tid| {
            if let Ok(mut f) = flags.lock() {
                f[tid] = ftz_daz_enabled();
            }
        });
        let flags = flags.into_inner().expect("lock");
        assert!(
            flags.iter().all(|&on| on),
            "barrier pool workers: {flags:?}"
        );
        let private: Vec<bool> =
            candle_core::utils::with_threadpool(|| rayon::broadcast(|_| ftz_daz_enabled()));
        assert!(
            private.iter().all(|&on| on),
            "candle's private rayon pool: {private:?}"
        );
    }

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn subnormal_products_flush_to_zero_after_init() {
        init_compute_threads();
        // 1e-30 * 1e-10 = 1e-40 is subnormal in f32; with FTZ it becomes exactly zero.
        let a = std::hint::black_box(1e-30f32);
        let b = std::hint::black_box(1e-10f32);
        assert_eq!(a * b, 0.0);
    }

    #[test]
    fn set_on_a_plain_thread_takes_effect_there() {
        // Threads outside rayon's pool (tokio, std::thread) must set the flags themselves.
        let after = std::thread::spawn(|| {
            set_ftz_daz_on_this_thread();
            ftz_daz_enabled()
        })
        .join()
        .expect("thread panicked");
        let supported = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
        assert_eq!(after, supported);
    }
}
