//! The bf16 products against an f64 reference of the bf16-rounded inputs, every available kernel
//! against the portable one, and the packs' layouts.

use super::*;

fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * 0.731 + seed).sin() * 1.7).powi(3))
        .collect()
}

/// The reference and, per entry, the sum of the products' magnitudes (the scale of f32
/// summation error).
fn reference_with_magnitude(
    a: &[f32],
    b: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0.0f64; m * n];
    let mut mag = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for kk in 0..k {
                let p = round_bf16(a[i * k + kk]) as f64 * round_bf16(b[j * k + kk]) as f64;
                c[i * n + j] += p;
                mag[i * n + j] += p.abs();
            }
        }
    }
    (c, mag)
}

/// f32 summation of `k` terms: about sqrt(k) units of f32 epsilon times the magnitude sum
/// (a lost or doubled product is off by a whole product, far beyond this).
fn tolerance(magnitude: f64, k: usize) -> f64 {
    1e-6 + 2.0 * (k as f64).sqrt() * f32::EPSILON as f64 * magnitude
}

fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

fn check(m: usize, n: usize, k: usize) {
    let a = values(m * k, 0.3);
    let b = values(n * k, 1.9);
    let (want, magnitude) = reference_with_magnitude(&a, &b, m, n, k);
    let (pa, pb) = (PackedA::from_rows(&a, m, k), PackedB::from_rows(&b, n, k));
    for kernel in [
        Backend::Portable,
        Backend::Avx2,
        Backend::Avx512Bf16,
        Backend::Amx,
    ] {
        if !kernel.available() {
            continue;
        }
        let mut c = vec![f32::NAN; m * n];
        matmul_with(kernel, &pa, &pb, &mut c);
        for (idx, (&got, &w)) in c.iter().zip(&want).enumerate() {
            assert!(
                (got as f64 - w).abs() <= tolerance(magnitude[idx], k),
                "{} {m}x{n}x{k} [{idx}]: {got} vs {w}",
                kernel.name()
            );
        }
    }
    let from_rows = matmul(&pa, &pb);
    let from_cols = matmul(
        &PackedA::from_cols(&transpose(&a, m, k), k, m),
        &PackedB::from_cols(&transpose(&b, n, k), k, n),
    );
    assert_eq!(
        from_rows, from_cols,
        "packing layouts disagree at {m}x{n}x{k}"
    );
    for (idx, (&got, &w)) in from_rows.iter().zip(&want).enumerate() {
        // f32 accumulation of exact bf16 products: error ~ k * eps_f32 * |terms|.
        assert!(
            (got as f64 - w).abs() <= tolerance(magnitude[idx], k),
            "{m}x{n}x{k} [{idx}]: {got} vs {w}"
        );
    }
}

#[test]
fn matches_the_bf16_rounded_reference_on_edge_shapes() {
    for &(m, n, k) in &[
        (1, 1, 1),
        (1, 64, 2),
        (7, 65, 3),
        (6, 128, 64),
        (13, 70, 33),
        (97, 129, 200),
        (200, 5, 577),
        (2, 300, 1),
        (40, 70, 1100),
        (3, 5, 0),
    ] {
        check(m, n, k);
    }
}

#[test]
fn every_available_kernel_agrees_with_the_portable_one() {
    let mut ran = Vec::new();
    for &(m, n, k) in &[
        (1, 5, 3),
        (11, 77, 45),
        (33, 130, 64),
        (200, 64, 70),
        (17, 64, 1),
    ] {
        let a = PackedA::from_rows(&values(m * k, 0.1), m, k);
        let b = PackedB::from_rows(&values(n * k, 0.2), n, k);
        let mut portable = vec![f32::NAN; m * n];
        matmul_with(Backend::Portable, &a, &b, &mut portable);
        for kernel in [Backend::Amx, Backend::Avx512Bf16, Backend::Avx2] {
            if !kernel.available() {
                eprintln!(
                    "skipped: the {} kernel is not available on this CPU",
                    kernel.name()
                );
                continue;
            }
            ran.push(kernel.name());
            let mut got = vec![f32::NAN; m * n];
            matmul_with(kernel, &a, &b, &mut got);
            for (x, y) in got.iter().zip(&portable) {
                assert!(
                    (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                    "{} at {m}x{n}x{k}: {x} vs {y}",
                    kernel.name()
                );
            }
        }
    }
    eprintln!("kernels checked against the portable one: {ran:?}");
}

#[test]
fn accumulating_adds_to_c_with_every_kernel() {
    // k = 1100 spans several AMX passes (KC pairs each) and an edge block.
    let (m, n, k) = (37, 70, 1100);
    let (av, bv) = (values(m * k, 0.4), values(n * k, 0.8));
    let (a, b) = (PackedA::from_rows(&av, m, k), PackedB::from_rows(&bv, n, k));
    let (want, magnitude) = reference_with_magnitude(&av, &bv, m, n, k);
    let start: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.5 - 100.0).collect();
    for kernel in [
        Backend::Portable,
        Backend::Avx2,
        Backend::Avx512Bf16,
        Backend::Amx,
    ] {
        if !kernel.available() {
            eprintln!(
                "skipped: the {} kernel is not available on this CPU",
                kernel.name()
            );
            continue;
        }
        let mut c = start.clone();
        matmul_acc_with(kernel, &a, &b, &mut c);
        for (idx, &got) in c.iter().enumerate() {
            let w = want[idx] + start[idx] as f64;
            let tol = tolerance(magnitude[idx] + start[idx].abs() as f64, k);
            assert!(
                (got as f64 - w).abs() <= tol,
                "{} [{idx}]: {got} vs {w}",
                kernel.name()
            );
        }
    }
}

#[test]
fn rounding_is_to_nearest_even() {
    assert_eq!(bf16_bits(1.0), 0x3f80);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
    assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3f80);
    // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (the latter).
    assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3f82);
    assert!(bf16_to_f32(bf16_bits(f32::NAN)).is_nan());
    assert_eq!(bf16_to_f32(bf16_bits(f32::INFINITY)), f32::INFINITY);
    assert_eq!(round_bf16(-0.0).to_bits(), (-0.0f32).to_bits());
}

#[test]
fn the_vectorized_conversion_gives_the_scalar_bits() {
    // Specials, ties, subnormals, the largest finite values (which round to infinity),
    // then a sweep of bit patterns.
    let mut inputs = vec![
        0.0f32,
        -0.0,
        1.0,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_7fff),
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffc0_1234),
    ];
    inputs.extend((0..100_000u32).map(|i| f32::from_bits(i.wrapping_mul(0x9e37_79b9))));
    let mut got = vec![0u16; inputs.len()];
    convert::bits(&inputs, &mut got);
    for (x, g) in inputs.iter().zip(&got) {
        assert_eq!(*g, bf16_bits(*x), "bits of {:#x}", x.to_bits());
    }
    let (lo, hi) = inputs.split_at(inputs.len() / 2);
    let mut words = vec![0u32; lo.len()];
    convert::pairs(lo, Some(&hi[..lo.len()]), &mut words);
    for (i, w) in words.iter().enumerate() {
        assert_eq!(
            *w,
            bf16_bits(lo[i]) as u32 | (bf16_bits(hi[i]) as u32) << 16
        );
    }
    convert::pairs(lo, None, &mut words);
    for (i, w) in words.iter().enumerate() {
        assert_eq!(*w, bf16_bits(lo[i]) as u32);
    }
}

#[test]
fn packs_hold_the_rounded_values_in_their_layouts() {
    // Odd depths (a padded last pair), partial panels and row blocks.
    for (rows, k) in [(1, 1), (5, 7), (17, 33), (70, 64), (130, 77)] {
        let mut a = values(rows * k, 0.7);
        // Specials where the vector rounding has its own lanes for them.
        let len = a.len();
        a[len / 2] = f32::NAN;
        a[len - 1] = f32::INFINITY;
        a[len / 3] = f32::from_bits(0x7f80_0001);
        let at = transpose(&a, rows, k);
        let from_rows = PackedA::from_rows(&a, rows, k);
        let from_cols = PackedA::from_cols(&at, k, rows);
        assert_eq!(from_rows.data, from_cols.data, "PackedA [{rows}, {k}]");
        // Packed into a region (decoding's weights): the same words, padding zero, and a
        // second matrix after the first.
        let region = crate::pages::PageRegion::new(2 * PackedA::words(rows, k));
        for _ in 0..2 {
            let in_pages = PackedA::from_rows_in(&a, rows, k, region.as_ref());
            assert_eq!(
                in_pages.data, from_rows.data,
                "PackedA [{rows}, {k}] in pages"
            );
            assert_eq!(in_pages.region().is_some(), region.is_some());
            assert!(
                in_pages.clone().region().is_none(),
                "a clone is on the heap"
            );
        }
        for r in 0..rows {
            for kk in 0..k {
                let word = from_rows.data[r * from_rows.kp + kk / 2];
                let bits = if kk % 2 == 0 {
                    word as u16
                } else {
                    (word >> 16) as u16
                };
                assert_eq!(bits, bf16_bits(a[r * k + kk]), "A ({r}, {kk})");
            }
        }
        assert!(
            from_rows.data[rows * from_rows.kp..]
                .iter()
                .all(|&w| w == 0),
            "A's padding rows"
        );
        let b_rows = PackedB::from_rows(&a, rows, k);
        let b_cols = PackedB::from_cols(&at, k, rows);
        assert_eq!(b_rows.data, b_cols.data, "PackedB [{rows}, {k}]");
        for c in 0..rows {
            let (p, col) = (c / NR, c % NR);
            let panel = b_rows.panel(p);
            for kk in 0..k {
                let got = panel[(kk / 2) * NR * 2 + col * 2 + (kk & 1)];
                assert_eq!(got, bf16_bits(a[c * k + kk]), "B ({c}, {kk})");
            }
        }
    }
}
