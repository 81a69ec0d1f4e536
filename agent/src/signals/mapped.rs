//! A BPF array map created with BPF_F_MMAPABLE, mapped into the agent: the
//! kernel's slots, control block and victim plans are read and written
//! through memory, with no syscall per access.
//!
//! The kernel writes this memory while the agent runs, so the agent never
//! makes a Rust reference (`&` or `&mut`) into it: callers get raw
//! pointers ([`MappedArray::at`]) and go through `read_volatile`,
//! `write_volatile` or atomics made with `from_ptr`.

use std::{ffi::c_void, os::fd::AsFd, ptr::NonNull};

use aya::maps::MapData;
use rustix::mm::{MapFlags, ProtFlags};

use super::page_size;

/// A shared mapping of a BPF array map created with BPF_F_MMAPABLE.
pub(super) struct MappedArray<T> {
    ptr: NonNull<T>,
    len: usize,
    bytes: usize,
}

// SAFETY: the mapping is shared memory that lives until drop, whichever
// thread holds it; all access goes through raw pointers with volatile or
// atomic operations, never through references.
unsafe impl<T> Send for MappedArray<T> {}
// SAFETY: as for Send: the type hands out raw pointers only, and every
// access through them is volatile or atomic.
unsafe impl<T> Sync for MappedArray<T> {}

impl<T> MappedArray<T> {
    pub(super) fn new(map: &MapData, len: usize) -> std::io::Result<MappedArray<T>> {
        let page = page_size() as usize;
        let bytes = std::mem::size_of::<T>()
            .checked_mul(len)
            .map(|b| b.div_ceil(page) * page)
            .ok_or_else(|| std::io::Error::other("mapping length overflows"))?;
        // SAFETY: a fresh shared mapping of a BPF array map's fd (the kernel
        // documents mmap for BPF_F_MMAPABLE maps), placed by the kernel, so
        // it aliases no memory of ours; the length covers whole pages of the
        // array. The kernel refuses (and we return the error) if the map is
        // smaller or not mmapable.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                bytes,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                map.fd().as_fd(),
                0,
            )
        }?;
        let ptr = NonNull::new(ptr.cast::<T>()).ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(MappedArray { ptr, len, bytes })
    }

    /// A raw pointer to entry `index`, valid as long as `self` is.
    pub(super) fn at(&self, index: u32) -> *mut T {
        assert!((index as usize) < self.len, "slot index {index} out of range");
        // SAFETY: in bounds of the mapping, checked above; `add` only
        // computes an address.
        unsafe { self.ptr.as_ptr().add(index as usize) }
    }
}

impl<T> Drop for MappedArray<T> {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped; no pointer into it
        // outlives `self` (callers get them through `at`, tied to `self`).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast::<c_void>(), self.bytes) };
    }
}
