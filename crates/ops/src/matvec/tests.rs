//! The decode products against an f64 reference for every available kernel, and the
//! properties the decode loop relies on (an output depends only on its own input row).

use super::*;
use crate::bf16::PackedA;
use crate::dispatch::DecodePrefetch;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (i as f32 * 0.37 + seed as f32).sin() * 1.7)
        .collect()
}

#[test]
fn f32_weight_rows_match_an_f64_product_for_any_split() {
    // n = 300: one full block of 256 weight rows and a partial one; k = 37 is not a multiple
    // of any vector width.
    for m in [1, 2, 5, 16] {
        let (n, k) = (300, 37);
        let x = values(m * k, 1);
        let w = values(n * k, 2);
        let y = matmul_f32_weight_rows(&x, m, &w, n, k);
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k)
                    .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                    .sum();
                let got = y[i * n + j] as f64;
                assert!(
                    (got - exact).abs() < 1e-5 * (1.0 + exact.abs()),
                    "m {m} ({i}, {j})"
                );
            }
        }
        // A row's values do not depend on how many rows share the call.
        let alone = matmul_f32_weight_rows(&x[..k], 1, &w, n, k);
        assert_eq!(alone, y[..n]);
    }
    assert!(matmul_f32_weight_rows(&[], 0, &values(6, 3), 2, 3).is_empty());
}

/// f64 reference of the bf16 policy: both operands rounded to bf16.
fn reference(w: &[f32], x: &[f32], rows: usize, cols: usize, batch: usize, bf16: bool) -> Vec<f64> {
    let r = |v: f32| {
        if bf16 {
            crate::bf16::round_bf16(v) as f64
        } else {
            v as f64
        }
    };
    let mut out = vec![0.0; batch * rows];
    for b in 0..batch {
        for j in 0..rows {
            out[b * rows + j] = (0..cols)
                .map(|k| r(w[j * cols + k]) * r(x[b * cols + k]))
                .sum();
        }
    }
    out
}

#[test]
fn both_layouts_match_the_reference_for_every_batch_size_and_odd_shapes() {
    for (rows, cols) in [(37, 64), (16, 576), (9, 40), (3, 7), (100, 33), (13, 576)] {
        let w = values(rows * cols, 1);
        let packed = PackedA::from_rows(&w, rows, cols);
        for batch in [1, 2, 3, 4, 5, 6, 7, 8, 11] {
            let x = values(batch * cols, 2);
            for bf16 in [false, true] {
                let weights = if bf16 {
                    packed.weights()
                } else {
                    Weights::F32 {
                        data: &w,
                        rows,
                        cols,
                    }
                };
                let mut inputs = Inputs::new();
                inputs.prepare(&x, batch, cols, bf16);
                inputs.stream_weights(rows % 2 == 1);
                let want = reference(&w, &x, rows, cols, batch, bf16);
                for kernel in [
                    Kernel::Portable,
                    Kernel::Avx2,
                    Kernel::Avx512,
                    Kernel::Avx512Bf16,
                ] {
                    if !kernel.available() {
                        eprintln!(
                            "skipped: the {} kernel is not available on this CPU",
                            kernel.name()
                        );
                        continue;
                    }
                    // Two disjoint row ranges, as two threads would split them.
                    let mut out = vec![f32::NAN; batch * rows];
                    let split = rows / 2;
                    // SAFETY: each range's writes stay inside `out` (batch x rows, stride
                    // rows); the kernel is available.
                    unsafe {
                        matvec_with(kernel, &weights, &inputs, 0..split, out.as_mut_ptr(), rows);
                        matvec_with(
                            kernel,
                            &weights,
                            &inputs,
                            split..rows,
                            out.as_mut_ptr().add(split),
                            rows,
                        );
                    }
                    for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
                        let tol = 1e-5 * (1.0 + want.abs()) * (cols as f64).sqrt();
                        assert!(
                            (got as f64 - want).abs() <= tol,
                            "{} [{rows}x{cols}] batch {batch} bf16 {bf16} element {i}: {got} vs {want}",
                            kernel.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn an_output_does_not_depend_on_the_other_inputs_of_the_call() {
    // Past 8 inputs the rows are blocked (a large LM-head-like matrix: several blocks) and
    // past 64 the inputs are chunked; every input row alone gives the same bits as among 70.
    for (rows, cols) in [(700, 576), (45, 1536), (13, 40)] {
        let w = values(rows * cols, 5);
        let packed = PackedA::from_rows(&w, rows, cols);
        let batch = 70;
        let x = values(batch * cols, 6);
        for bf16 in [false, true] {
            let weights = if bf16 {
                packed.weights()
            } else {
                Weights::F32 {
                    data: &w,
                    rows,
                    cols,
                }
            };
            for kernel in [
                Kernel::Portable,
                Kernel::Avx2,
                Kernel::Avx512,
                Kernel::Avx512Bf16,
            ] {
                if !kernel.available() {
                    eprintln!(
                        "skipped: the {} kernel is not available on this CPU",
                        kernel.name()
                    );
                    continue;
                }
                let run = |x: &[f32], n: usize, stream: Option<DecodePrefetch>| {
                    let mut inputs = Inputs::new();
                    inputs.prepare(x, n, cols, bf16);
                    inputs.stream_weights(stream.is_some());
                    if let Some(tuning) = stream {
                        inputs.prefetch_with(tuning);
                    }
                    let mut out = vec![f32::NAN; n * rows];
                    // SAFETY: writes stay inside `out` (n x rows); the kernel is available.
                    unsafe {
                        matvec_with(kernel, &weights, &inputs, 0..rows, out.as_mut_ptr(), rows)
                    };
                    out
                };
                let all = run(&x, batch, None);
                // Nor on how the weights are prefetched (`stream_weights`, and every choice of
                // `dispatch::decode_prefetch`, whose tile height at 8 inputs changes which rows
                // share a tile), nor on the batch size's tile shape (batch 1 takes the widest).
                for stream in std::iter::once(None).chain(every_prefetch().map(Some)) {
                    let all_tuned = run(&x, batch, stream);
                    assert!(
                        all.iter()
                            .zip(&all_tuned)
                            .all(|(a, t)| a.to_bits() == t.to_bits()),
                        "{} [{rows}x{cols}] bf16 {bf16} {stream:?}: 70 inputs",
                        kernel.name()
                    );
                    for b in [0, 7, 8, 19, 64, 69] {
                        let alone = run(&x[b * cols..(b + 1) * cols], 1, stream);
                        let together = &all[b * rows..(b + 1) * rows];
                        assert!(
                            alone
                                .iter()
                                .zip(together)
                                .all(|(a, t)| a.to_bits() == t.to_bits()),
                            "{} [{rows}x{cols}] bf16 {bf16} {stream:?} input {b}",
                            kernel.name()
                        );
                    }
                }
            }
        }
    }
}

/// Every prefetch hint at the kernels' own distance and at 4 KiB, with both tile heights at 8
/// inputs.
fn every_prefetch() -> impl Iterator<Item = DecodePrefetch> {
    use crate::dispatch::PrefetchHint::*;
    [None, T0, T1, T2, Nta].into_iter().flat_map(|hint| {
        [(Option::None, 3), (Some(4096), 2)].map(|(ahead, dp_rows_at_8)| DecodePrefetch {
            hint,
            ahead,
            dp_rows_at_8,
            source: "test",
        })
    })
}

#[test]
fn dot_and_axpy_match_plain_loops_with_every_kernel() {
    for n in [0, 1, 7, 8, 15, 16, 17, 64, 100] {
        let a = values(n, 3);
        let b = values(n, 4);
        let dot_want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let got = dot(&a, &b);
        assert!(
            (got as f64 - dot_want).abs() <= 1e-5 * (1.0 + n as f64),
            "dot n {n}: {got} vs {dot_want}"
        );
        let mut y = values(n, 5);
        let want: Vec<f32> = y.iter().zip(&a).map(|(&v, &x)| v + 0.5 * x).collect();
        axpy(&mut y, 0.5, &a);
        for (g, w) in y.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                "axpy n {n}: {g} vs {w}"
            );
        }
    }
    eprintln!("dot/axpy ran on the {} kernel", kernel().name());
}

#[test]
fn the_safe_entry_point_refuses_a_short_output() {
    let w = values(4 * 8, 1);
    let weights = Weights::F32 {
        data: &w,
        rows: 4,
        cols: 8,
    };
    let mut inputs = Inputs::new();
    inputs.prepare(&values(16, 2), 2, 8, false);
    let mut out = vec![0.0; 5];
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        matvec(&weights, &inputs, 0..4, &mut out, 4)
    }));
    assert!(caught.is_err());
}

#[test]
fn weight_rows_products_equal_the_activation_side_gemm() {
    let (n, k) = (70, 96);
    let w: Vec<f32> = (0..n * k).map(|i| ((i as f32) * 0.61).sin()).collect();
    let packed = PackedA::from_rows(&w, n, k);
    for m in [1, 5, 16, 17, 40, 130] {
        let x: Vec<f32> = (0..m * k).map(|i| ((i as f32) * 0.23).cos()).collect();
        let want = crate::bf16::matmul(
            &PackedA::from_rows(&x, m, k),
            &crate::bf16::PackedB::from_rows(&w, n, k),
        );
        let got = matmul_weight_rows(&x, m, &packed);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "m {m} element {i}: {a} vs {b}"
            );
        }
    }
}
