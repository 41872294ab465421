//! The shapes every bf16 kernel shares: the panel width `NR`, the row blocks (`MR` rows per
//! AVX512-BF16 microkernel call, `MC` rows per parallel task), the `Tile` of C one task writes,
//! and `SyncPtr`, which hands disjoint tiles of one buffer to rayon tasks.
//!
//! What it is not: a kernel. Invariant: tasks given `Tile`s through one `SyncPtr` write disjoint
//! elements of C.
#![allow(unsafe_code)]

/// Columns of C per panel of B.
pub const NR: usize = 64;
/// Rows of C per AVX512 microkernel call.
pub(super) const MR: usize = 6;
/// Rows of C per parallel task (a multiple of 32 and of MR).
pub(super) const MC: usize = 192;

/// Rows `row0..row0 + rows` and columns `col0..col0 + cols` (<= NR) of C.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub(super) row0: usize,
    pub(super) rows: usize,
    pub(super) col0: usize,
    pub(super) cols: usize,
    /// `C += A B^T` instead of `C = A B^T`.
    pub(super) accumulate: bool,
}

#[derive(Clone, Copy)]
pub(crate) struct SyncPtr(pub(crate) *mut f32);
// SAFETY: used only to hand disjoint tiles of one buffer to rayon tasks (see `dispatch::run_tiles_raw`, `pack::par_filled`, `matvec::matvec_parallel`).
unsafe impl Send for SyncPtr {}
// SAFETY: as for Send: each task writes only its own tile through the pointer.
unsafe impl Sync for SyncPtr {}
impl SyncPtr {
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
