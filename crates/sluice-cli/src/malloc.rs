//! glibc's allocator settings for the `sluice` process.
//!
//! A plan allocates every batch afresh: with `pipelines/images.sql`, about 25 MB of
//! decoded, resized, cropped, normalised and transposed buffers per 128-row batch,
//! megabytes per allocation. glibc serves allocations over its mmap threshold with a
//! fresh `mmap`, and it gives back to the kernel whatever is free at the top of a thread's
//! heap past its trim threshold (128 KiB). Either way the next batch faults its pages in
//! again and the kernel zeroes them. That was a third of `sluice checksum`'s CPU on that
//! plan (system time 0.34–0.41 s of 0.97–1.13 s). A `sluice run` producer of the same plan
//! gains less, about 5 % (docs/history/benchmarks-2026-11.md, "The producer's allocator").
//!
//! The `sluice` binary therefore keeps allocations up to 32 MiB (glibc's most) in its
//! heaps and keeps up to 128 MiB free at a heap's top. This is more than a thread's
//! arena heap (64 MiB), so those heaps are not trimmed. The process's peak memory
//! use does not grow: the memory is kept and reused, not added to. A setting the user
//! gives glibc (`GLIBC_TUNABLES`, or the older `MALLOC_MMAP_THRESHOLD_` and
//! `MALLOC_TRIM_THRESHOLD_`) is left as it is. The libraries leave the allocator alone:
//! it is the embedding process's to choose, and a Rust program that embeds a `Producer`
//! can set the same tunables.

/// The mmap threshold set: glibc's largest (`HEAP_MAX_SIZE / 2` on 64-bit).
const MMAP_THRESHOLD: i32 = 32 << 20;
/// The trim threshold set: more than a thread arena's heap (64 MiB on 64-bit).
const TRIM_THRESHOLD: i32 = 128 << 20;

/// Which of the two settings the user left to Sluice (mmap threshold, trim threshold),
/// given `GLIBC_TUNABLES` and whether `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_`
/// are set.
fn left_to_us(tunables: Option<&str>, mmap_var: bool, trim_var: bool) -> (bool, bool) {
    let tuned = |name: &str| {
        tunables.is_some_and(|t| t.split(':').any(|kv| kv.split('=').next() == Some(name)))
    };
    (
        !mmap_var && !tuned("glibc.malloc.mmap_threshold"),
        !trim_var && !tuned("glibc.malloc.trim_threshold"),
    )
}

/// Applies the settings (see the module's documentation) where the user did not choose
/// them; a no-op where the C library is not glibc.
pub fn tune() {
    let tunables = std::env::var("GLIBC_TUNABLES").ok();
    let (mmap, trim) = left_to_us(
        tunables.as_deref(),
        std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some(),
        std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_some(),
    );
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (wanted, param, value, name) in [
        (
            mmap,
            libc::M_MMAP_THRESHOLD,
            MMAP_THRESHOLD,
            "mmap threshold",
        ),
        (
            trim,
            libc::M_TRIM_THRESHOLD,
            TRIM_THRESHOLD,
            "trim threshold",
        ),
    ] {
        if !wanted {
            continue;
        }
        // SAFETY: `mallopt` takes two integers and changes glibc's malloc parameters
        // under the main arena's lock, so it is sound whatever other threads do (none run
        // yet: this is called first thing in `main`). Both values are within what glibc
        // accepts: the mmap threshold at most HEAP_MAX_SIZE / 2, the trim threshold any
        // size. It touches no memory of ours.
        if unsafe { libc::mallopt(param, value) } != 1 {
            tracing::debug!("glibc refused the {name} of {value} bytes; its default stays");
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (mmap, trim, MMAP_THRESHOLD, TRIM_THRESHOLD);
}

#[cfg(test)]
mod tests {
    use super::left_to_us;

    #[test]
    fn settings_the_user_gave_glibc_are_left_alone() {
        assert_eq!(left_to_us(None, false, false), (true, true));
        assert_eq!(left_to_us(None, true, false), (false, true));
        assert_eq!(left_to_us(None, false, true), (true, false));
        assert_eq!(
            left_to_us(Some("glibc.malloc.trim_threshold=1048576"), false, false),
            (true, false)
        );
        assert_eq!(
            left_to_us(
                Some("glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536"),
                false,
                false
            ),
            (false, true)
        );
        // Other tunables, and names that only begin like ours, are not ours.
        assert_eq!(
            left_to_us(
                Some("glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold_x=1"),
                false,
                false
            ),
            (true, true)
        );
    }
}
