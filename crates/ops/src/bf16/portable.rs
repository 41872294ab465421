//! The portable tile kernel (`Backend::Portable`): the same bf16 values, f32 products and sums,
//! in plain loops. Every CPU runs it; the vector kernels are checked against it.
//!
//! What it is not: fast, nor a reference in f64 (the tests hold that).
#![allow(unsafe_code)]

use super::pack::{PackedA, bf16_to_f32};
use super::tile::{NR, Tile};

/// The same bf16 values, f32 products and sums, in plain loops.
///
/// # Safety
/// As `compute_tile`.
pub(super) unsafe fn tile(a: &PackedA, panel: &[u16], c: *mut f32, ldc: usize, tile: Tile) {
    let kp = a.kp;
    for r in 0..tile.rows {
        let row = tile.row0 + r;
        let pairs = &a.data[row * kp..(row + 1) * kp];
        let mut acc = [0.0f32; NR];
        for (j, &pr) in pairs.iter().enumerate() {
            let (lo, hi) = (bf16_to_f32(pr as u16), bf16_to_f32((pr >> 16) as u16));
            let b = &panel[j * NR * 2..(j + 1) * NR * 2];
            for (col, v) in acc.iter_mut().enumerate() {
                *v += lo * bf16_to_f32(b[col * 2]) + hi * bf16_to_f32(b[col * 2 + 1]);
            }
        }
        // SAFETY: row < m and col0 + cols <= ldc: inside C, owned by this tile.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(c.add(row * ldc + tile.col0), tile.cols) };
        if tile.accumulate {
            dst.iter_mut().zip(&acc).for_each(|(d, v)| *d += v);
        } else {
            dst.copy_from_slice(&acc[..tile.cols]);
        }
    }
}
