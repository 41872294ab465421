//! Which kernel computes each tile of a bf16 product: the public `matmul*`
//! entry points, the split of C into (row block, panel) tasks over rayon, and
//! `rows_times_panel` for callers that pack their own operands.
//!
//! What it is not: where the kernel is chosen (`crate::dispatch`; `Backend` and `backend` are
//! re-exported from there), nor a kernel (each instruction set has its own file: `amx`, `avx512bf16`, `avx2`,
//! `portable`) nor a pack (`pack`). Invariants: a kernel runs only if `available()`; tasks write
//! disjoint tiles of C; every kernel gives the same values up to f32 summation order.
#![allow(unsafe_code)]

use rayon::prelude::*;

use super::pack::{PackedA, PackedB};
use super::tile::{MC, NR, SyncPtr, Tile};

/// Which kernel runs the bf16 matmuls (chosen by `crate::dispatch`, the one CPU dispatch point).
pub use crate::dispatch::Bf16Kernel as Backend;

/// The kernel in use: `STOKE_BF16_KERNEL` if set (and available), else the fastest available
/// (`crate::dispatch::bf16_kernel`).
pub fn backend() -> Backend {
    crate::dispatch::bf16_kernel()
}

/// `C = A B^T` into a new `[m, n]` row-major f32 buffer.
pub fn matmul(a: &PackedA, b: &PackedB) -> Vec<f32> {
    let mut c = vec![0.0f32; a.m * b.n];
    matmul_into(a, b, &mut c);
    c
}

/// `C = A B^T`, overwriting `c` (`[m, n]` row-major).
pub fn matmul_into(a: &PackedA, b: &PackedB, c: &mut [f32]) {
    matmul_with(backend(), a, b, c)
}

/// `C += A B^T` (`c` is `[m, n]` row-major).
pub fn matmul_acc(a: &PackedA, b: &PackedB, c: &mut [f32]) {
    run_tiles(backend(), a, b, c, true)
}

/// `C += A B^T` with a given kernel (which must be `available()`).
pub fn matmul_acc_with(kernel: Backend, a: &PackedA, b: &PackedB, c: &mut [f32]) {
    run_tiles(kernel, a, b, c, true)
}

/// `C = A B^T` with a given kernel (which must be `available()`).
pub fn matmul_with(kernel: Backend, a: &PackedA, b: &PackedB, c: &mut [f32]) {
    run_tiles(kernel, a, b, c, false)
}

fn run_tiles(kernel: Backend, a: &PackedA, b: &PackedB, c: &mut [f32], accumulate: bool) {
    assert_eq!(
        c.len(),
        a.m * b.n,
        "bf16 matmul: C has {} values for [{}, {}]",
        c.len(),
        a.m,
        b.n
    );
    // SAFETY: C is an initialized [m, n] buffer (asserted).
    unsafe { run_tiles_raw(kernel, a, b, c.as_mut_ptr(), accumulate) }
}

/// `C = A B^T` into a new `[m, n]` buffer with a given kernel (which must be `available()`).
/// With the AVX512-BF16 kernel C is not zeroed first: when not accumulating that kernel only
/// stores to C, and its tiles cover every element (a training step at SmolLM2-135M made
/// about 2 GB of products, each zeroed on one thread before the kernels overwrote it).
pub fn matmul_new_with(kernel: Backend, a: &PackedA, b: &PackedB) -> Vec<f32> {
    let len = a.m * b.n;
    if kernel != Backend::Avx512Bf16 || a.kp == 0 || len == 0 {
        let mut c = vec![0.0f32; len];
        matmul_with(kernel, a, b, &mut c);
        return c;
    }
    let mut c: Vec<f32> = Vec::with_capacity(len);
    // SAFETY: C has room for [m, n] floats; with the AVX512-BF16 kernel and `accumulate`
    // false every one of them is stored (never read) by `run_tiles_raw`, so all are
    // initialized when the length is set.
    unsafe {
        run_tiles_raw(kernel, a, b, c.as_mut_ptr(), false);
        c.set_len(len);
    }
    c
}

/// # Safety
/// `c` points to `a.m * b.n` writable floats, initialized unless `accumulate` is false and
/// `kernel` is `Avx512Bf16` (which then only stores to them, each once).
unsafe fn run_tiles_raw(kernel: Backend, a: &PackedA, b: &PackedB, c: *mut f32, accumulate: bool) {
    assert_eq!(a.k, b.k, "bf16 matmul: A has depth {}, B {}", a.k, b.k);
    assert!(
        kernel.available(),
        "bf16 matmul: the {} kernel is not available",
        kernel.name()
    );
    let (m, n) = (a.m, b.n);
    if m == 0 || n == 0 {
        return;
    }
    if a.kp == 0 {
        // An empty contraction: C = 0 (or unchanged when accumulating).
        if !accumulate {
            // SAFETY: m * n writable floats (the caller's contract).
            unsafe { std::ptr::write_bytes(c, 0, m * n) };
        }
        return;
    }
    let panels = PackedB::panels(n);
    let row_blocks = m.div_ceil(MC);
    // One task per (row block, panel); rows of a block are disjoint across blocks and the
    // columns of a panel disjoint across panels, so tasks write disjoint tiles of C.
    let c_ptr = SyncPtr(c);
    let run = |task: usize| {
        let (block, p) = (task / panels, task % panels);
        let tile = Tile {
            row0: block * MC,
            rows: (m - block * MC).min(MC),
            col0: p * NR,
            cols: (n - p * NR).min(NR),
            accumulate,
        };
        // SAFETY: the tile lies inside C ([m, n], see Tile) and belongs to this task alone.
        unsafe { compute_tile(kernel, a, b.panel(p), c_ptr.get(), n, tile) };
    };
    if row_blocks * panels == 1 {
        run(0);
    } else {
        (0..row_blocks * panels).into_par_iter().for_each(run);
    }
}

/// # Safety
/// `c` is C, `[m, ldc]` row-major, and `tile` lies inside it; `kernel` is available.
unsafe fn compute_tile(
    kernel: Backend,
    a: &PackedA,
    panel: &[u16],
    c: *mut f32,
    ldc: usize,
    tile: Tile,
) {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded; AMX is available (the caller checked) and A is padded to whole
        // tiles (PackedA::words).
        Backend::Amx => unsafe { super::amx::tile(a.kp, &a.data, panel, c, ldc, tile) },
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512Bf16 => {
            let a_rows = &a.data[tile.row0 * a.kp..];
            // SAFETY: rows row0..row0 + rows < m of A (kp pairs each) and of C, columns
            // col0..col0 + cols <= ldc of C, all this tile's (the caller's contract).
            unsafe {
                super::avx512bf16::rows(
                    a.kp,
                    a.kp,
                    a_rows,
                    tile.rows,
                    panel,
                    c.add(tile.row0 * ldc + tile.col0),
                    ldc,
                    tile.cols,
                    tile.accumulate,
                )
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded; the CPU has AVX2 and FMA (the backend is available).
        Backend::Avx2 => unsafe { super::avx2::tile(a.kp, &a.data, panel, c, ldc, tile) },
        // SAFETY: forwarded.
        _ => unsafe { super::portable::tile(a, panel, c, ldc, tile) },
    }
}

/// `C[r][c] (+)= sum_{j < pairs} A[r * lda + j] . panel[j][c]` for `r < rows`, `c < cols`
/// (<= NR): the AVX512-BF16 microkernel on raw operands, for callers that pack their own
/// (the attention kernels: sub-ranges of a contraction, strided rows). `a` holds pair words,
/// `panel` `[pairs][NR][2]` bf16; C is row-major with stride `ldc`. Needs
/// `Backend::Avx512Bf16.available()`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rows_times_panel(
    a: &[u32],
    lda: usize,
    rows: usize,
    pairs: usize,
    panel: &[u16],
    c: &mut [f32],
    ldc: usize,
    cols: usize,
    accumulate: bool,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        Backend::Avx512Bf16.available(),
        "rows_times_panel: no AVX512-BF16"
    );
    assert!(
        pairs <= lda || rows == 1,
        "rows_times_panel: {pairs} pairs, stride {lda}"
    );
    assert!(
        a.len() >= (rows - 1) * lda + pairs,
        "rows_times_panel: A too short"
    );
    assert!(
        panel.len() >= pairs * NR * 2,
        "rows_times_panel: panel too short"
    );
    assert!(cols <= NR && cols <= ldc && c.len() >= (rows - 1) * ldc + cols);
    // SAFETY: AVX512-BF16 is available and the operands' extents were asserted above.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        super::avx512bf16::rows(
            pairs,
            lda,
            a,
            rows,
            panel,
            c.as_mut_ptr(),
            ldc,
            cols,
            accumulate,
        )
    };
}
