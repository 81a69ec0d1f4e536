//! A BPF array map created with BPF_F_MMAPABLE, mapped into the agent: the
//! kernel's slots, control block and victim plans are read and written
//! through memory, with no syscall per access.

use std::os::fd::{AsFd, AsRawFd};

use aya::maps::MapData;

use super::page_size;

/// A shared mapping of a BPF array map created with BPF_F_MMAPABLE.
pub(super) struct MappedArray<T> {
    ptr: *mut T,
    len: usize,
    bytes: usize,
}

// SAFETY: the mapping is shared memory that lives until drop; all access
// goes through raw pointers with volatile or atomic operations.
unsafe impl<T> Send for MappedArray<T> {}
unsafe impl<T> Sync for MappedArray<T> {}

impl<T> MappedArray<T> {
    pub(super) fn new(map: &MapData, len: usize) -> std::io::Result<MappedArray<T>> {
        let page = page_size() as usize;
        let bytes = (std::mem::size_of::<T>() * len).div_ceil(page) * page;
        // SAFETY: mapping a BPF array map's fd, as the kernel documents for
        // BPF_F_MMAPABLE maps; the length covers whole pages of the array.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MappedArray { ptr: ptr.cast(), len, bytes })
    }

    pub(super) fn at(&self, index: u32) -> *mut T {
        assert!((index as usize) < self.len, "slot index {index} out of range");
        // SAFETY: in bounds, checked above.
        unsafe { self.ptr.add(index as usize) }
    }
}

impl<T> Drop for MappedArray<T> {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}
