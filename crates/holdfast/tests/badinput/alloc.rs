//! The test binary's allocator: the system's, noting the largest single
//! request, so a test can tell whether a client reserved a buffer as big as
//! a hostile length prefix said. Resident memory would not tell: a
//! reservation of gigabytes is only address space until it is written, and
//! an allocator that cannot give it aborts the process. A global allocator
//! is `unsafe` to implement, hence the one `allow(unsafe_code)`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn note(size: usize) {
    if size > LARGEST.load(Ordering::Relaxed) {
        LARGEST.fetch_max(size, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on to `System` unchanged; only a counter is kept.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

/// The largest single allocation requested so far in this process, in bytes.
// Read by the garbage-peer tests, which need a network store's feature.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub fn largest() -> usize {
    LARGEST.load(Ordering::Relaxed)
}
