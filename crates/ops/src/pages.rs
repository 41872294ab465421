//! Memory for weights that decoding streams: one anonymous mapping, aligned to 2 MiB and advised
//! for transparent huge pages, carved into the packed matrices of a model (`PageRegion`).
//!
//! Why: a batch-1 decode step reads every weight once, so its speed is the speed of one sweep
//! over a few hundred megabytes. On 4 KiB pages that sweep walks the page tables every 64 cache
//! lines and the hardware prefetchers stop at every page boundary. Measured on a 2-vCPU Zen 4
//! (SmolLM2-135M's 269 MB of bf16 weights in the decode step's phases, 2 threads, alternated in
//! one process): a plain read loop 28-31 GB/s on 4 KiB pages and 41-47 on 2 MiB pages; the
//! decode kernel 32 against 37-43. The model's weights are many separate allocations of 0.2-57
//! MB, most smaller than a huge page, so each one on its own mapping would waste up to 2 MiB;
//! one region for all of them wastes at most the end of its last huge page.
//!
//! What it is not: a general allocator. A region hands out disjoint, zeroed ranges from a bump
//! pointer and never reuses them; it is unmapped when its last range is dropped (so one range
//! held elsewhere keeps the whole region mapped). Where the
//! kernel does not give huge pages (transparent huge pages set to `never`), the region still
//! works on ordinary pages. Off Linux/glibc `PageRegion::new` returns `None` and callers keep
//! their weights on the heap.
#![allow(unsafe_code)]

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The huge page size advised for (x86-64 and most Linux targets).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const HUGE_PAGE: usize = 2 << 20;
/// Every range starts on a cache line (16 words).
const ALIGN_WORDS: usize = 16;

/// One mapping of zeroed `u32` words, handed out as disjoint ranges (`take`).
pub struct PageRegion {
    base: *mut u32,
    /// Capacity in words.
    words: usize,
    /// Words handed out so far (a multiple of `ALIGN_WORDS`).
    next: AtomicUsize,
    /// The mapping as made (`base` is its first 2 MiB boundary).
    map: *mut u8,
    map_len: usize,
}

// SAFETY: the region owns its mapping; its words are only reached through `RegionWords`, each of
// which owns a disjoint range exclusively (see `take`). The bump pointer is atomic.
unsafe impl Send for PageRegion {}
// SAFETY: as above; `&PageRegion` only allows `take`, which is atomic.
unsafe impl Sync for PageRegion {}

impl PageRegion {
    /// Words a range of `words` words takes from a region (rounded up to a cache line;
    /// `usize::MAX` where that overflows, which no region can hold).
    pub fn words_for(words: usize) -> usize {
        words
            .checked_next_multiple_of(ALIGN_WORDS)
            .unwrap_or(usize::MAX)
    }

    /// A zeroed region of at least `words` words, advised for huge pages. `None` where the
    /// platform has no such mappings, for zero words, or when the mapping fails (the caller then
    /// uses the heap; nothing is lost but speed).
    pub fn new(words: usize) -> Option<Arc<PageRegion>> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            if words == 0 {
                return None;
            }
            let bytes = words.checked_mul(4)?.checked_next_multiple_of(HUGE_PAGE)?;
            let map_len = bytes.checked_add(HUGE_PAGE)?;
            // SAFETY: an anonymous private mapping with no address hint; the result is checked.
            let map = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if map == libc::MAP_FAILED {
                return None;
            }
            let map = map.cast::<u8>();
            let offset = (map as usize).next_multiple_of(HUGE_PAGE) - map as usize;
            // SAFETY: offset < HUGE_PAGE, so base..base + bytes lies inside the mapping.
            let base = unsafe { map.add(offset) };
            // SAFETY: the range is inside the mapping just made. The advice is a hint: if it
            // fails (huge pages disabled) the region still works on ordinary pages.
            unsafe {
                libc::madvise(base.cast(), bytes, libc::MADV_HUGEPAGE);
            }
            Some(Arc::new(PageRegion {
                base: base.cast(),
                words: bytes / 4,
                next: AtomicUsize::new(0),
                map,
                map_len,
            }))
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        {
            let _ = words;
            None
        }
    }

    /// `words` zeroed words of this region for the caller alone, or `None` when it is full.
    pub fn take(self: &Arc<Self>, words: usize) -> Option<RegionWords> {
        let size = words.checked_next_multiple_of(ALIGN_WORDS)?;
        let start = self
            .next
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |next| {
                next.checked_add(size).filter(|&end| end <= self.words)
            })
            .ok()?;
        Some(RegionWords {
            // SAFETY: start + size <= words, so the range lies inside the region; no other
            // range covers it (the bump pointer only moves forward).
            ptr: unsafe { self.base.add(start) },
            len: words,
            region: Arc::clone(self),
        })
    }

    /// Words handed out so far.
    pub fn used(&self) -> usize {
        self.next.load(Ordering::Acquire)
    }

    /// Capacity in words.
    pub fn capacity(&self) -> usize {
        self.words
    }
}

impl Drop for PageRegion {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: the mapping made in `new`, unmapped once; no `RegionWords` outlives the region
        // (each holds an `Arc` to it).
        unsafe {
            libc::munmap(self.map.cast(), self.map_len);
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        let _ = (self.map, self.map_len);
    }
}

impl fmt::Debug for PageRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageRegion")
            .field("words", &self.words)
            .field("used", &self.used())
            .finish()
    }
}

/// A range of a `PageRegion`, owned exclusively; derefs to its words.
pub struct RegionWords {
    ptr: *mut u32,
    len: usize,
    region: Arc<PageRegion>,
}

// SAFETY: the range is owned exclusively (like a `Vec<u32>`) and the region is kept alive.
unsafe impl Send for RegionWords {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for RegionWords {}

impl RegionWords {
    /// The region this range belongs to.
    pub fn region(&self) -> &Arc<PageRegion> {
        &self.region
    }
}

impl Deref for RegionWords {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        // SAFETY: `len` words from `ptr` lie inside the live region and belong to this range.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for RegionWords {
    fn deref_mut(&mut self) -> &mut [u32] {
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl fmt::Debug for RegionWords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionWords")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_region_hands_out_disjoint_zeroed_aligned_ranges_until_full() {
        let region = PageRegion::new(1000).expect("an anonymous mapping");
        // 1000 words round up to one huge page.
        assert_eq!(region.capacity(), (2 << 20) / 4);
        let mut a = region.take(5).expect("room");
        let mut b = region.take(37).expect("room");
        assert_eq!((a.len(), b.len()), (5, 37));
        assert!(a.iter().chain(b.iter()).all(|&w| w == 0));
        for p in [a.as_ptr() as usize, b.as_ptr() as usize] {
            assert_eq!(p % 64, 0, "a range starts on a cache line");
        }
        assert_eq!(
            b.as_ptr() as usize - a.as_ptr() as usize,
            64,
            "bumped by whole lines"
        );
        a.fill(7);
        b.fill(9);
        assert!(a.iter().all(|&w| w == 7) && b.iter().all(|&w| w == 9));
        assert_eq!(region.used(), 16 + 48);
        let rest = region.capacity() - region.used();
        assert!(region.take(rest + 1).is_none(), "more than is left");
        let last = region.take(rest).expect("exactly what is left");
        assert!(last.iter().all(|&w| w == 0));
        assert!(region.take(1).is_none(), "full");
        assert!(
            region.take(usize::MAX - 3).is_none(),
            "a size that overflows"
        );
        assert_eq!(PageRegion::words_for(usize::MAX - 3), usize::MAX);
        // The ranges keep the region alive after the caller's handle is gone.
        drop(region);
        assert!(a.iter().all(|&w| w == 7) && b.iter().all(|&w| w == 9));
    }

    #[test]
    fn an_empty_region_is_none() {
        assert!(PageRegion::new(0).is_none());
    }
}
