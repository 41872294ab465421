//! Q8_0: the format against llama.cpp's rule and GGUF's bytes, and every kernel path this CPU
//! has against f64 references (the dequantized operands, and the unquantized ones within the
//! quantization error), bit for bit against each other, and independent of the batch and the
//! row split.

use super::*;

/// Values of varied size per position, with an all-zero first block (`d = 0`).
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            if i < BLOCK {
                return 0.0;
            }
            (i as f32 * 0.37 + seed as f32).sin() * (0.05 + (i % 7) as f32) * 0.3
        })
        .collect()
}

/// The kernel paths this CPU has; the others are reported, not passed silently.
fn paths() -> Vec<Q8Kernel> {
    Q8Kernel::ALL
        .into_iter()
        .filter(|k| {
            let ok = k.available();
            if !ok {
                eprintln!("skipped: {} not available on this CPU", k.name());
            }
            ok
        })
        .collect()
}

fn run(kernel: Q8Kernel, w: &Q8Matrix, x: &Q8Inputs) -> Vec<f32> {
    let rows = w.rows();
    let mut out = vec![f32::NAN; x.batch() * rows];
    q8_matvec_with(kernel, w, x, 0..rows, &mut out, rows);
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

/// Block amax of `v` (`[n, cols]`) at each position, for the a-priori error bounds.
fn block_amax(v: &[f32], cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    for (row, dst) in v.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        for (part, d) in row.chunks(BLOCK).zip(dst.chunks_mut(BLOCK)) {
            let amax = part.iter().fold(0f32, |m, x| m.max(x.abs()));
            d.fill(amax);
        }
    }
    out
}

#[test]
fn f16_conversion_rounds_to_nearest_even() {
    for (x, h) in [
        (1.0f32, 0x3c00u16),
        (-2.0, 0xc000),
        (65504.0, 0x7bff),
        (65520.0, 0x7c00),
        (0.1, 0x2e66),
        (1.0 / 3.0, 0x3555),
        (1.0 + 1.0 / 2048.0, 0x3c00),
        (1.0 + 3.0 / 2048.0, 0x3c02),
        (2f32.powi(-24), 0x0001),
        (2f32.powi(-25), 0x0000),
        (1.5 * 2f32.powi(-25), 0x0001),
        (2f32.powi(-14), 0x0400),
        (f32::INFINITY, 0x7c00),
        (0.0, 0x0000),
        (-0.0, 0x8000),
    ] {
        assert_eq!(f32_to_f16(x), h, "{x}");
    }
    assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
    for h in 0..=u16::MAX {
        let x = f16_to_f32(h);
        if !x.is_nan() {
            assert_eq!(f32_to_f16(x), h, "{h:#06x} -> {x}");
        }
    }
}

#[test]
fn quantize_then_dequantize_is_within_half_a_step() {
    for (rows, cols) in [(1, 32), (7, 96), (5, 1000)] {
        let w = values(rows * cols, 3);
        let m = Q8Matrix::quantize(&w, rows, cols);
        let deq = m.dequantize();
        assert_eq!(deq.len(), rows * cols);
        let amax = block_amax(&w, cols);
        for (k, ((&x, &y), &a)) in w.iter().zip(&deq).zip(&amax).enumerate() {
            let d = a / 127.0;
            let d16 = f16_to_f32(m.block(k / cols, k % cols / BLOCK).0);
            // Half a step of the f32 scale, plus up to 127 steps of the scale's f16 rounding.
            let bound = d / 2.0 + 127.0 * (d - d16).abs() + 1e-6 * x.abs();
            assert!((x - y).abs() <= bound, "[{rows}, {cols}] {k}: {x} -> {y}");
        }
        // The zero block has d = 0, q = 0; padding past `cols` is zeros.
        assert_eq!(m.block(0, 0), (0, [0; BLOCK]));
        let (_, last) = m.block(rows - 1, cols.div_ceil(BLOCK) - 1);
        assert!(last[(cols - 1) % BLOCK + 1..].iter().all(|&q| q == 0));
    }
}

/// llama.cpp's `quantize_row_q8_0_ref`, written out as GGUF bytes.
fn gguf_bytes(w: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in w.chunks_exact(BLOCK) {
        let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
        out.extend(block.iter().map(|&x| (x * id).round() as i8 as u8));
    }
    out
}

#[test]
fn gguf_bytes_give_the_blocks_quantize_makes() {
    for (rows, cols) in [(1, 32), (3, 64), (5, 576)] {
        let w = values(rows * cols, 5);
        let from_bytes = Q8Matrix::from_gguf_bytes(&gguf_bytes(&w), rows, cols).unwrap();
        assert_eq!(from_bytes, Q8Matrix::quantize(&w, rows, cols));
        assert_eq!(from_bytes.bytes(), rows * cols / BLOCK * 34);
    }
    // Quants GGUF may hold that the rule never makes (-128) survive.
    let mut bytes = vec![0u8; 34];
    bytes[..2].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
    bytes[2] = 0x80;
    bytes[3] = 0x7f;
    let m = Q8Matrix::from_gguf_bytes(&bytes, 1, 32).unwrap();
    assert_eq!(&m.dequantize()[..3], &[-64.0, 63.5, 0.0]);
}

#[test]
fn bad_gguf_sizes_are_refused_with_a_reason() {
    let err = Q8Matrix::from_gguf_bytes(&[0; 34], 1, 48).unwrap_err();
    assert!(err.contains("not a multiple of 32"), "{err}");
    let err = Q8Matrix::from_gguf_bytes(&[0; 67], 1, 64).unwrap_err();
    assert!(err.contains("expected 68 bytes"), "{err}");
    let err = Q8Matrix::from_gguf_bytes(&[0; 34], usize::MAX, 64).unwrap_err();
    assert!(err.contains("overflows"), "{err}");
}

#[test]
fn every_path_matches_the_dequantized_product_bit_for_bit_with_the_others() {
    let paths = paths();
    for rows in [1, 7, 45, 300] {
        // Blocks per row: 1, 3, 17, 18, 20, 24, 30 and 32: narrow groups of every power of two
        // up to 8 (the AVX-512 kernel's folded loads), of 3 and 14 (both AVX2 halves), none.
        for cols in [32, 96, 544, 576, 640, 768, 960, 1000] {
            let w = values(rows * cols, 1);
            let m = Q8Matrix::quantize(&w, rows, cols);
            let wd = m.dequantize();
            let wa = block_amax(&w, cols);
            for batch in 1..=11 {
                let x = values(batch * cols, 2 + batch as u32);
                let mut inputs = Q8Inputs::new();
                inputs.prepare(&x, batch, cols);
                let xd = inputs.dequantize();
                let xa = block_amax(&x, cols);
                let first = run(paths[0], &m, &inputs);
                for b in 0..batch {
                    for j in 0..rows {
                        let (wr, xr) = (j * cols..(j + 1) * cols, b * cols..(b + 1) * cols);
                        let mut exact = 0f64;
                        let mut size = 0f64;
                        let mut unquantized = 0f64;
                        let mut bound = 0f64;
                        for (k, l) in wr.zip(xr) {
                            let t = wd[k] as f64 * xd[l] as f64;
                            exact += t;
                            size += t.abs();
                            unquantized += w[k] as f64 * x[l] as f64;
                            // |w x - wd xd| <= |w - wd| |x| + |wd| |x - xd|, each error at most
                            // half a step plus the f16 rounding of the weight scale.
                            bound += 0.57 * wa[k] as f64 / 127.0 * (x[l] as f64).abs()
                                + (wd[k] as f64).abs() * 0.51 * xa[l] as f64 / 127.0;
                        }
                        let got = first[b * rows + j] as f64;
                        let at = format!("[{rows}, {cols}] batch {batch} ({b}, {j})");
                        assert!((got - exact).abs() <= 1e-5 * size, "{at}: {got} vs {exact}");
                        assert!(
                            (got - unquantized).abs() <= bound + 1e-5 * size,
                            "{at}: {got} vs unquantized {unquantized} (bound {bound})"
                        );
                    }
                }
                for &kernel in &paths[1..] {
                    assert_eq!(
                        bits(&run(kernel, &m, &inputs)),
                        bits(&first),
                        "{} vs {}: [{rows}, {cols}] batch {batch}",
                        kernel.name(),
                        paths[0].name()
                    );
                }
            }
        }
    }
}

#[test]
fn full_range_gguf_quants_match_the_dequantized_product() {
    // Every byte value as a quant, -128 included, under scales of varied size.
    let (rows, cols) = (37, 800);
    let mut bytes = Vec::new();
    for i in 0..rows * cols / BLOCK {
        let d = 0.001 * (1 + i % 13) as f32;
        bytes.extend_from_slice(&f32_to_f16(d).to_le_bytes());
        bytes.extend((0..BLOCK).map(|e| ((i * 37 + e * 11) % 256) as u8));
    }
    let m = Q8Matrix::from_gguf_bytes(&bytes, rows, cols).unwrap();
    let wd = m.dequantize();
    let paths = paths();
    for batch in [1, 3, 8, 9] {
        let mut inputs = Q8Inputs::new();
        inputs.prepare(&values(batch * cols, 9), batch, cols);
        let xd = inputs.dequantize();
        let first = run(paths[0], &m, &inputs);
        for b in 0..batch {
            for j in 0..rows {
                let terms = (0..cols).map(|k| wd[j * cols + k] as f64 * xd[b * cols + k] as f64);
                let (exact, size) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                let got = first[b * rows + j] as f64;
                assert!(
                    (got - exact).abs() <= 1e-5 * size,
                    "batch {batch} ({b}, {j})"
                );
            }
        }
        for &kernel in &paths[1..] {
            assert_eq!(
                bits(&run(kernel, &m, &inputs)),
                bits(&first),
                "{}",
                kernel.name()
            );
        }
    }
}

#[test]
fn an_output_depends_only_on_its_input_row_and_weight_row() {
    let (rows, cols, batch) = (700, 576, 11);
    let w = values(rows * cols, 4);
    let x = values(batch * cols, 6);
    let m = Q8Matrix::quantize(&w, rows, cols);
    let mut inputs = Q8Inputs::new();
    inputs.prepare(&x, batch, cols);
    for kernel in paths() {
        let all = run(kernel, &m, &inputs);
        // Alone in its batch.
        for b in [0, 5, 10] {
            let mut one = Q8Inputs::new();
            one.prepare(&x[b * cols..(b + 1) * cols], 1, cols);
            assert_eq!(
                bits(&run(kernel, &m, &one)),
                bits(&all[b * rows..(b + 1) * rows]),
                "{} input {b}",
                kernel.name()
            );
        }
        // Rows split at an odd place, into a wider output.
        let split = 333;
        let stride = rows + 5;
        let mut parts = vec![f32::NAN; batch * stride];
        q8_matvec_with(kernel, &m, &inputs, 0..split, &mut parts, stride);
        q8_matvec_with(
            kernel,
            &m,
            &inputs,
            split..rows,
            &mut parts[split..],
            stride,
        );
        for b in 0..batch {
            assert_eq!(
                bits(&parts[b * stride..b * stride + rows]),
                bits(&all[b * rows..(b + 1) * rows]),
                "{} split, input {b}",
                kernel.name()
            );
        }
        // Every prefetch choice for streaming weights.
        for hint in [
            PrefetchHint::None,
            PrefetchHint::T0,
            PrefetchHint::T1,
            PrefetchHint::T2,
            PrefetchHint::Nta,
        ] {
            let mut streamed = inputs.clone();
            streamed.stream_weights(true);
            streamed.prefetch_with(DecodePrefetch {
                hint,
                ahead: Some(4096),
                dp_rows_at_8: 2,
                source: "test",
            });
            assert_eq!(bits(&run(kernel, &m, &streamed)), bits(&all), "{hint:?}");
        }
    }
    // The parallel entry (three blocks of 256 rows) with the chosen kernel.
    let mut parallel = vec![f32::NAN; batch * rows];
    q8_matvec_parallel(&m, &inputs, &mut parallel);
    assert_eq!(bits(&parallel), bits(&run(kernel(), &m, &inputs)));
}

#[test]
fn the_chosen_kernel_is_available() {
    assert!(kernel().available(), "{}", kernel().name());
    eprintln!("q8 kernel: {}", kernel().name());
}
