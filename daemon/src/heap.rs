//! The C allocator's settings for a process that runs for months.
//!
//! glibc raises its mmap threshold each time it frees a mapped block, up to 32 MiB. After the
//! prompt cache evicts or a request frees its first few-MiB buffer, later buffers of that size
//! come from the heap arenas instead, and what they leave behind when freed stays resident:
//! RSS then climbs in steps of a few MiB that no ledger term accounts for, and a soak cannot
//! tell them from a leak. Fixing the threshold keeps every large buffer (KV snapshots, state
//! saves, the logits of a big vocabulary) in its own mapping, given back to the kernel on free.

/// The fixed threshold: above the default model's logits row (49,152 × 4 bytes), which is
/// allocated per token, and well below a prompt-cache entry (a short chat's is 1–8 MiB).
pub const MMAP_THRESHOLD_BYTES: usize = 256 * 1024;

/// What [`fix_mmap_threshold`] did, for the boot log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threshold {
    /// Fixed at [`MMAP_THRESHOLD_BYTES`].
    Fixed,
    /// `MALLOC_MMAP_THRESHOLD_` is set: glibc already applied the operator's value.
    FromEnvironment,
    /// Not glibc (musl has no such threshold), or mallopt refused.
    Unchanged,
}

/// Fixes glibc's mmap threshold unless the environment already set one. Call it before
/// the runtime starts threads.
pub fn fix_mmap_threshold() -> Threshold {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
        return Threshold::FromEnvironment;
    }
    set_threshold(MMAP_THRESHOLD_BYTES)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_threshold(bytes: usize) -> Threshold {
    let Ok(value) = libc::c_int::try_from(bytes) else {
        return Threshold::Unchanged;
    };
    // SAFETY: mallopt only changes allocator parameters; it returns 0 on a refused value.
    if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, value) } == 1 {
        Threshold::Fixed
    } else {
        Threshold::Unchanged
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_threshold(_bytes: usize) -> Threshold {
    Threshold::Unchanged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_accepts_the_threshold() {
        assert_eq!(set_threshold(MMAP_THRESHOLD_BYTES), Threshold::Fixed);
    }
}
