//! The machine's memory-read rate, measured: the ceiling that batch-1 decoding is held to ("at
//! least 80% of the memory-bandwidth ceiling for the weight precision used").
//!
//! `ReadBuffer` is a buffer far larger than the caches filled with distinct pseudo-random words
//! (a repeating pattern can be merged into shared pages by the hypervisor, and then reads hit
//! the cache), on ordinary 4 KiB pages or on 2 MiB huge pages (`crate::pages`, where decoding
//! keeps its bf16 weights). `read_gb_per_s` reads it once on `threads` threads, each its own
//! share as `streams` sequential parts in lockstep, with software prefetches `ahead` bytes on,
//! and returns GB/s. The loop loads 64 bytes at a time (AVX-512 where the CPU has it, checked at
//! run time), so it is bound by memory, not by its own instructions. `ceiling` takes the best
//! of the usual configurations. Used by `bench_bandwidth` and `bench_decode_share`; not a test.
#![allow(unsafe_code)]

use std::time::Instant;

/// A read-only buffer of distinct pseudo-random words, on the heap or on huge pages.
pub enum ReadBuffer {
    Heap(Vec<u64>),
    /// Pairs of u32 words, each pair one u64 (see `words`).
    Pages(crate::pages::RegionWords),
}

impl ReadBuffer {
    /// `mib` MiB of words, on huge pages if `huge` (falls back to the heap where the platform
    /// has no page regions: see `is_huge`).
    pub fn new(mib: usize, huge: bool) -> ReadBuffer {
        let words = (mib << 20) / 8;
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let pages = huge
            .then(|| crate::pages::PageRegion::new(words * 2).and_then(|r| r.take(words * 2)))
            .flatten();
        match pages {
            Some(mut pages) => {
                for pair in pages.chunks_exact_mut(2) {
                    let w = random();
                    pair.copy_from_slice(&[w as u32, (w >> 32) as u32]);
                }
                ReadBuffer::Pages(pages)
            }
            None => ReadBuffer::Heap((0..words).map(|_| random()).collect()),
        }
    }

    /// Whether the words are in a huge-page region.
    pub fn is_huge(&self) -> bool {
        matches!(self, ReadBuffer::Pages(_))
    }

    fn words(&self) -> &[u64] {
        match self {
            // SAFETY: a region's words start on a cache line (8-byte aligned) and are an even
            // number of u32 words (made so in `new`); they live as long as `self`.
            ReadBuffer::Pages(p) => unsafe {
                std::slice::from_raw_parts(p.as_ptr().cast::<u64>(), p.len() / 2)
            },
            ReadBuffer::Heap(heap) => heap,
        }
    }

    /// Bytes read by one `read_gb_per_s`.
    pub fn bytes(&self) -> usize {
        self.words().len() * 8
    }
}

/// One read of the whole buffer on `threads` threads (each its share as `streams` parts,
/// prefetching `ahead` bytes on in each part); GB/s. The XOR of the words is returned too, so
/// the reads cannot be optimized away.
pub fn read_gb_per_s(
    buffer: &ReadBuffer,
    threads: usize,
    streams: usize,
    ahead: usize,
) -> (f64, u64) {
    let words = buffer.words();
    let threads = threads.max(1);
    let share = words.len() / threads / 8 * 8;
    assert!(
        share >= 8 * streams.max(1),
        "read_gb_per_s: {} words for {threads} threads of {streams} streams",
        words.len()
    );
    let start = Instant::now();
    let check = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let part = &words[t * share..(t + 1) * share];
                scope.spawn(move || read(part, streams.max(1), ahead))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a read thread panicked"))
            .fold(0, |x, s| x ^ s)
    });
    let seconds = start.elapsed().as_secs_f64();
    let read = share / streams.max(1) / 8 * 8 * streams.max(1) * threads;
    ((read * 8) as f64 / seconds / 1e9, check)
}

/// The best GB/s of one read each of `buffers` in the usual configurations: 1 or 8 streams a
/// thread, prefetching 0 or 256 bytes on.
pub fn ceiling(buffers: &[&ReadBuffer], threads: usize) -> f64 {
    let mut best = 0f64;
    let mut check = 0;
    for buffer in buffers {
        for streams in [1, 8] {
            for ahead in [0, 256] {
                let (gb, c) = read_gb_per_s(buffer, threads, streams, ahead);
                best = best.max(gb);
                check ^= c;
            }
        }
    }
    std::hint::black_box(check);
    best
}

fn read(share: &[u64], streams: usize, ahead: usize) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is available (checked).
        return unsafe { read_avx512(share, streams, ahead) };
    }
    read_portable(share, streams, ahead)
}

/// XOR of every word of `share`, read as `streams` parts in lockstep, one cache line (8 words)
/// of each part per round.
fn read_portable(share: &[u64], streams: usize, ahead: usize) -> u64 {
    let part = share.len() / streams / 8 * 8;
    let mut acc = [0u64; 8];
    let ahead_words = ahead / 8;
    for i in (0..part).step_by(8) {
        for s in 0..streams {
            let at = s * part + i;
            if ahead_words > 0 {
                prefetch(share.as_ptr().wrapping_add(at + ahead_words));
            }
            for (a, &w) in acc.iter_mut().zip(&share[at..at + 8]) {
                *a ^= w;
            }
        }
    }
    acc.iter().fold(0, |x, &a| x ^ a)
}

/// `read_portable` with one 64-byte load a line.
///
/// # Safety
/// AVX-512F is available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_avx512(share: &[u64], streams: usize, ahead: usize) -> u64 {
    use std::arch::x86_64::*;
    let part = share.len() / streams / 8 * 8;
    let ahead_words = ahead / 8;
    let p = share.as_ptr();
    let mut acc = _mm512_setzero_si512();
    for i in (0..part).step_by(8) {
        for s in 0..streams {
            let at = s * part + i;
            if ahead_words > 0 {
                prefetch(p.wrapping_add(at + ahead_words));
            }
            // SAFETY: at + 8 <= streams * part <= share.len().
            let line = unsafe { _mm512_loadu_si512(p.add(at).cast()) };
            acc = _mm512_xor_si512(acc, line);
        }
    }
    let mut lanes = [0u64; 8];
    // SAFETY: 64 bytes into an 8-word array.
    unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), acc) };
    lanes.iter().fold(0, |x, &a| x ^ a)
}

/// A hint to fetch the line at `p`; valid for any address.
#[inline(always)]
fn prefetch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configuration_reads_every_word() {
        // The XOR of all words is the same whatever the threads, streams and prefetch.
        let buffer = ReadBuffer::new(1, true);
        let words = buffer.words();
        assert_eq!(buffer.bytes(), 1 << 20);
        let want = words.iter().fold(0, |x, &w| x ^ w);
        for threads in [1, 2] {
            for streams in [1, 4, 8] {
                for ahead in [0, 256] {
                    let (gb, check) = read_gb_per_s(&buffer, threads, streams, ahead);
                    assert!(gb > 0.0);
                    assert_eq!(check, want, "{threads} threads, {streams} streams");
                }
            }
        }
        assert_eq!(read_portable(words, 8, 256), want);
    }
}
