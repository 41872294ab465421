//! Packing: efficiency on synthetic length mixes, masks, and exact token accounting.

use std::collections::BTreeMap;

use stoke_data::packing::{DocPiece, PAD_DOC, PackedRow, Packer, PackingPolicy, build_batch};

/// Deterministic lognormal lengths (Box-Muller over an LCG), clamped to [1, max].
fn lognormal_lengths(seed: u64, n: usize, median: f64, sigma: f64, max: usize) -> Vec<usize> {
    let mut state = seed;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u1, u2) = (uniform(), uniform());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            ((median * (sigma * z).exp()) as usize).clamp(1, max)
        })
        .collect()
}

fn pack_all(policy: PackingPolicy, seq_len: usize, lengths: &[usize]) -> (Vec<PackedRow>, Packer) {
    let mut packer = Packer::new(policy, seq_len);
    let mut rows = Vec::new();
    for (doc, &len) in lengths.iter().enumerate() {
        packer.push_document(doc as u64, len);
        while let Some(row) = packer.pop_row() {
            rows.push(row);
        }
    }
    packer.flush();
    while let Some(row) = packer.pop_row() {
        rows.push(row);
    }
    (rows, packer)
}

/// Every token of every document appears in exactly one row (none lost or duplicated).
fn assert_exact_cover(rows: &[PackedRow], lengths: &[usize], capacity: usize) {
    let mut covered: BTreeMap<u64, Vec<(u32, u32)>> = BTreeMap::new();
    for row in rows {
        assert!(row.used() <= capacity, "row over capacity: {}", row.used());
        for p in &row.pieces {
            assert!(p.len > 0);
            covered.entry(p.doc).or_default().push((p.start, p.len));
        }
    }
    for (doc, &len) in lengths.iter().enumerate() {
        let mut spans = covered.remove(&(doc as u64)).unwrap_or_default();
        spans.sort();
        let mut next = 0u32;
        for (start, l) in spans {
            assert_eq!(start, next, "doc {doc}: gap or overlap at {start}");
            next = start + l;
        }
        assert_eq!(next as usize, len, "doc {doc}: covered {next} of {len}");
    }
    assert!(covered.is_empty(), "rows reference unknown documents");
}

const SEQ: usize = 2048;

#[test]
fn split_policy_exceeds_99_percent_on_lognormal_lengths() {
    let lengths = lognormal_lengths(7, 20_000, 600.0, 1.0, 20_000);
    let policy = PackingPolicy::BestFitDecreasingSplit { window_docs: 512 };
    let (rows, packer) = pack_all(policy, SEQ, &lengths);
    assert_exact_cover(&rows, &lengths, SEQ + 1);
    let eff = packer.stats().efficiency();
    assert!(eff > 0.99, "efficiency {eff}");
    // Every row but the final one is full.
    let partial = rows.iter().filter(|r| r.used() < SEQ + 1).count();
    assert!(partial <= 1, "{partial} partial rows");
}

#[test]
fn best_fit_without_split_never_cuts_documents_shorter_than_a_row() {
    let lengths = lognormal_lengths(8, 5_000, 300.0, 1.0, SEQ + 1);
    let policy = PackingPolicy::BestFitDecreasing { window_docs: 1000 };
    let (rows, packer) = pack_all(policy, SEQ, &lengths);
    assert_exact_cover(&rows, &lengths, SEQ + 1);
    for row in &rows {
        for p in &row.pieces {
            assert_eq!(
                (p.start as usize, p.len as usize),
                (0, lengths[p.doc as usize])
            );
        }
    }
    // Best fit on many short documents packs tightly even without splitting.
    let eff = packer.stats().efficiency();
    assert!(eff > 0.97, "efficiency {eff}");
}

#[test]
fn long_documents_are_chunked_into_full_rows() {
    let lengths = vec![3 * (SEQ + 1) + 10, 5];
    let policy = PackingPolicy::BestFitDecreasing { window_docs: 4 };
    let (rows, _) = pack_all(policy, SEQ, &lengths);
    assert_exact_cover(&rows, &lengths, SEQ + 1);
    assert_eq!(rows.iter().filter(|r| r.used() == SEQ + 1).count(), 3);
}

#[test]
fn concat_chunk_fills_every_row_but_the_last() {
    let lengths = lognormal_lengths(9, 3_000, 500.0, 1.2, 50_000);
    let (rows, packer) = pack_all(PackingPolicy::ConcatChunk, SEQ, &lengths);
    assert_exact_cover(&rows, &lengths, SEQ + 1);
    assert!(rows[..rows.len() - 1].iter().all(|r| r.used() == SEQ + 1));
    assert!(packer.stats().efficiency() > 0.999);
}

#[test]
fn batch_masks_restart_positions_and_never_cross_documents() {
    // Document d holds tokens 1000*d + i so every token says where it came from.
    let fetch = |p: &DocPiece, out: &mut Vec<u32>| -> Result<(), ()> {
        out.extend((p.start..p.start + p.len).map(|i| 1000 * p.doc as u32 + i));
        Ok(())
    };
    let rows = vec![
        PackedRow {
            pieces: vec![
                DocPiece {
                    doc: 1,
                    start: 0,
                    len: 3,
                },
                DocPiece {
                    doc: 2,
                    start: 5,
                    len: 2,
                },
            ],
        },
        PackedRow {
            pieces: vec![DocPiece {
                doc: 3,
                start: 0,
                len: 9,
            }],
        },
    ];
    let seq_len = 7;
    let batch = build_batch(&rows, seq_len, 99, fetch).unwrap();
    assert_eq!(batch.tokens.len(), 2 * seq_len);
    // Row 0: [1000 1001 1002 2005 2006 pad pad | pad] -> inputs are the first 7.
    assert_eq!(&batch.tokens[..7], &[1000, 1001, 1002, 2005, 2006, 99, 99]);
    assert_eq!(&batch.targets[..7], &[1001, 1002, 2005, 2006, 99, 99, 99]);
    assert_eq!(&batch.position_ids[..7], &[0, 1, 2, 0, 1, 0, 0]);
    assert_eq!(&batch.doc_ids[..7], &[0, 0, 0, 1, 1, PAD_DOC, PAD_DOC]);
    assert_eq!(
        &batch.loss_mask[..7],
        &[true, true, false, true, false, false, false]
    );
    // Row 1: one document of 9 tokens truncated to the 8-token row: all 7 targets count.
    assert_eq!(
        &batch.tokens[7..],
        &[3000, 3001, 3002, 3003, 3004, 3005, 3006]
    );
    assert_eq!(
        &batch.targets[7..],
        &[3001, 3002, 3003, 3004, 3005, 3006, 3007]
    );
    assert!(batch.loss_mask[7..].iter().all(|&m| m));
    assert_eq!(batch.num_loss_tokens(), 3 + 7);
}

#[test]
fn packing_is_deterministic() {
    let lengths = lognormal_lengths(10, 2_000, 400.0, 1.0, 10_000);
    let policy = PackingPolicy::BestFitDecreasingSplit { window_docs: 256 };
    assert_eq!(
        pack_all(policy, SEQ, &lengths).0,
        pack_all(policy, SEQ, &lengths).0
    );
}
