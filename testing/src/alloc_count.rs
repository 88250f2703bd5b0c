//! [`CountingAllocator`] (feature `alloc-count`): the system allocator, counting the bytes
//! a test binary holds and their peak, so that a test can measure what one call
//! allocates at most ([`peak_of`]).
//!
//! Install it as the binary's global allocator, and measure in a binary of one test: no
//! other thread may allocate while a measurement runs.
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: steady_testing::alloc_count::CountingAllocator =
//!     steady_testing::alloc_count::CountingAllocator;
//!
//! let (decoded, peak) = steady_testing::alloc_count::peak_of(|| decode(&bytes));
//! ```
//!
//! The crate's one piece of unsafe code: a `GlobalAlloc` implementation must be `unsafe`.
//! Every call goes to [`System`] unchanged; only counters are added.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting. A reallocation counts both blocks at its peak (the
/// old one may be copied into the new).
#[derive(Debug, Clone, Copy)]
pub struct CountingAllocator;

// SAFETY: every call goes to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            PEAK.fetch_max(CURRENT.fetch_add(layout.size(), Relaxed) + layout.size(), Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, layout) };
        CURRENT.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        // SAFETY: as above.
        let q = unsafe { System.realloc(p, layout, size) };
        if !q.is_null() {
            PEAK.fetch_max(CURRENT.fetch_add(size, Relaxed) + size, Relaxed);
            CURRENT.fetch_sub(layout.size(), Relaxed);
        }
        q
    }
}

/// `f`'s result and the most bytes it had allocated at once, beyond what was allocated
/// before it. Counts nothing (0) unless [`CountingAllocator`] is the global allocator.
pub fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = CURRENT.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = f();
    (out, PEAK.load(Relaxed).saturating_sub(base))
}
