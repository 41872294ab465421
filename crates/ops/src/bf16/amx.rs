//! The AMX tile kernel (`Backend::Amx`): `tdpbf16ps` over 2 x 2 tiles of 16 x 16 f32
//! accumulators, 32-deep slices of the contraction.
//!
//! What it is not: the dispatch (`dispatch::compute_tile` calls `tile` only when
//! `Backend::Amx.available()`, which also asked Linux for the tile data state) nor the packs.
//! Invariant: A is padded to whole 16-row tiles and the contraction to 16 pairs (`PackedA`), so
//! every tile load is full.
#![allow(unsafe_code)]

use super::tile::{NR, Tile};
use std::arch::asm;

/// The tile configuration: palette 1, all eight tiles 16 rows x 64 bytes.
/// Tiles 0-3: C (16 x 16 f32 each, a 2 x 2 block); 4, 5: A (16 rows x 32 bf16); 6, 7: B
/// (16 pair rows x 16 columns x 2 bf16).
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut bytes = [0u8; 64];
    bytes[0] = 1;
    let mut t = 0;
    while t < 8 {
        bytes[16 + 2 * t] = 64;
        bytes[48 + t] = 16;
        t += 1;
    }
    Config(bytes)
};

/// Bytes between consecutive pair rows of a B panel.
const B_STRIDE: usize = NR * 2 * 2;

/// Most pairs of the contraction per pass over a tile: the tile's slice of A (MC rows x
/// 512 pairs = 384 KiB) and of the B panel (128 KiB) then stay in L2 while every 32 x 32
/// block of the tile is updated. Longer contractions are split into equal passes.
const KC_MAX: usize = 512;

/// C tile of `tile.rows` x `tile.cols` from A's rows and one B panel (`C += ...` when
/// `tile.accumulate`).
///
/// # Safety
/// AMX is available and permitted; `a` is PackedA data (`kp` a multiple of 16 pairs, rows
/// padded to 16); `panel` has `kp` pair rows; `c` is C with row stride `ldc` and `tile`
/// inside it.
pub(super) unsafe fn tile(
    kp: usize,
    a: &[u32],
    panel: &[u16],
    c: *mut f32,
    ldc: usize,
    tile: Tile,
) {
    debug_assert!(kp.is_multiple_of(16) && panel.len() >= kp * NR * 2);
    let a_stride = kp * 4;
    let mut spill = [0.0f32; 32 * 32];
    // SAFETY: the configuration is valid for palette 1 (8 tiles of 16 x 64 bytes).
    unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
    let passes = kp.div_ceil(KC_MAX).max(1);
    let kc = (kp / 16).div_ceil(passes) * 16;
    for j0 in (0..kp).step_by(kc.max(16)) {
        let j1 = (j0 + kc).min(kp);
        let fresh = j0 == 0 && !tile.accumulate;
        let mut r = 0;
        while r < tile.rows {
            let two_rows = tile.rows - r > 16;
            let row = tile.row0 + r;
            debug_assert!(a.len() >= (row + if two_rows { 32 } else { 16 }) * kp);
            for half in 0..2 {
                let col = half * 32;
                if col >= tile.cols {
                    break;
                }
                let rows_here = (tile.rows - r).min(32);
                let cols_here = (tile.cols - col).min(32);
                let direct = rows_here == 32 && cols_here == 32;
                // The 32 x 32 block is read and written in C when whole, else in `spill`.
                let (block, stride) = if direct {
                    // SAFETY: the 32 x 32 block at (row, col0 + col) lies inside the tile.
                    (unsafe { c.add(row * ldc + tile.col0 + col) }, ldc * 4)
                } else {
                    (spill.as_mut_ptr(), 32 * 4)
                };
                if fresh {
                    // SAFETY: tilezero touches tile registers only.
                    unsafe {
                        asm!(
                            "tilezero tmm0",
                            "tilezero tmm1",
                            "tilezero tmm2",
                            "tilezero tmm3",
                            options(nostack, nomem)
                        );
                    }
                } else {
                    if !direct {
                        spill.fill(0.0);
                        for rr in 0..rows_here {
                            // SAFETY: row + rr < m and col0 + col + cols_here <= ldc.
                            let src = unsafe {
                                std::slice::from_raw_parts(
                                    c.add((row + rr) * ldc + tile.col0 + col),
                                    cols_here,
                                )
                            };
                            spill[rr * 32..rr * 32 + cols_here].copy_from_slice(src);
                        }
                    }
                    let block = if direct { block } else { spill.as_mut_ptr() };
                    // SAFETY: `block` has 32 rows of `stride` bytes with 32 floats each.
                    unsafe {
                        asm!(
                            "tileloadd tmm0, [{d} + {s}*1]",
                            "tileloadd tmm1, [{d2} + {s}*1]",
                            "tileloadd tmm2, [{d3} + {s}*1]",
                            "tileloadd tmm3, [{d4} + {s}*1]",
                            d = in(reg) block,
                            d2 = in(reg) block.add(16),
                            d3 = in(reg) block.byte_add(16 * stride),
                            d4 = in(reg) block.byte_add(16 * stride).add(16),
                            s = in(reg) stride,
                            options(nostack, readonly),
                        );
                    }
                }
                let a0 = a[row * kp..].as_ptr();
                let b0 = panel[col * 2..].as_ptr();
                // SAFETY: every tile load reads 16 rows of 64 bytes inside A (rows row..row +
                // 32 exist when two_rows, row..row + 16 always: padded) or inside the panel.
                unsafe {
                    for j in (j0..j1).step_by(16) {
                        let ap = a0.add(j);
                        let bp = b0.add(j * NR * 2);
                        if two_rows {
                            asm!(
                                "tileloadd tmm4, [{a} + {sa}*1]",
                                "tileloadd tmm5, [{a2} + {sa}*1]",
                                "tileloadd tmm6, [{b} + {sb}*1]",
                                "tileloadd tmm7, [{b2} + {sb}*1]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                "tdpbf16ps tmm3, tmm5, tmm7",
                                a = in(reg) ap,
                                a2 = in(reg) ap.add(16 * kp),
                                sa = in(reg) a_stride,
                                b = in(reg) bp,
                                b2 = in(reg) bp.add(32),
                                sb = in(reg) B_STRIDE,
                                options(nostack, readonly),
                            );
                        } else {
                            asm!(
                                "tileloadd tmm4, [{a} + {sa}*1]",
                                "tileloadd tmm6, [{b} + {sb}*1]",
                                "tileloadd tmm7, [{b2} + {sb}*1]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                a = in(reg) ap,
                                sa = in(reg) a_stride,
                                b = in(reg) bp,
                                b2 = in(reg) bp.add(32),
                                sb = in(reg) B_STRIDE,
                                options(nostack, readonly),
                            );
                        }
                    }
                }
                // SAFETY: as for the loads above; tiles 2 and 3 only hold rows of C when the
                // block has a second row tile (else they would write past the tile's rows
                // in C, so they are stored only then).
                unsafe {
                    asm!(
                        "tilestored [{d} + {s}*1], tmm0",
                        "tilestored [{d2} + {s}*1], tmm1",
                        d = in(reg) block,
                        d2 = in(reg) block.add(16),
                        s = in(reg) stride,
                        options(nostack),
                    );
                    if two_rows {
                        asm!(
                            "tilestored [{d} + {s}*1], tmm2",
                            "tilestored [{d2} + {s}*1], tmm3",
                            d = in(reg) block.byte_add(16 * stride),
                            d2 = in(reg) block.byte_add(16 * stride).add(16),
                            s = in(reg) stride,
                            options(nostack),
                        );
                    }
                }
                if !direct {
                    for rr in 0..rows_here {
                        // SAFETY: row + rr < m and col0 + col + cols_here <= ldc.
                        let out = unsafe {
                            std::slice::from_raw_parts_mut(
                                c.add((row + rr) * ldc + tile.col0 + col),
                                cols_here,
                            )
                        };
                        out.copy_from_slice(&spill[rr * 32..rr * 32 + cols_here]);
                    }
                }
            }
            r += 32;
        }
    }
    // SAFETY: releases this thread's tile state (configured above).
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}
