//! The stack of the threads that plan and execute queries.
//!
//! DataFusion and its SQL parser recurse over an expression's tree: a sum of 1,000 terms
//! overflowed the 2 MiB default stack of a tokio thread in a test build (`opt-level =
//! 0`), and one of 3,000 the 8 MiB of a process's main thread at `opt-level = 1`; a
//! stack overflow ends the process. Sluice's runtimes, the producer's and a catch-up's
//! thread take [`RUNTIME_THREAD_STACK`], and work started on a caller's thread (the
//! `sluice` command, Python's `sluice.Producer`) moves to such a thread with
//! [`on_deep_stack`].

use crate::error::{Result, SluiceError};

/// The stack of the threads that plan and execute queries. Only the pages a thread
/// touches are backed by memory.
pub const RUNTIME_THREAD_STACK: usize = 32 << 20;

/// Runs `f` on a thread of its own with a [`RUNTIME_THREAD_STACK`] stack and returns
/// what it returns; a panic in `f` continues on the calling thread.
pub fn on_deep_stack<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .stack_size(RUNTIME_THREAD_STACK)
            .spawn_scoped(scope, f)
            .map_err(|e| SluiceError::io(format!("cannot start the thread '{name}'"), e))?;
        Ok(thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recurses, in frames of at least 16 KiB, until `bytes` of stack below `top` are in
    /// use; returns how many are.
    fn use_stack(top: usize, bytes: usize) -> usize {
        let frame = std::hint::black_box([0u8; 16 << 10]);
        let used = top.saturating_sub(frame.as_ptr() as usize);
        match used >= bytes {
            true => used,
            false => use_stack(top, bytes) + usize::from(frame[used % frame.len()]),
        }
    }

    #[test]
    fn work_on_a_deep_stack_recurses_past_the_default_stacks() {
        // 12 MiB: more than a main thread's 8 MiB and a spawned thread's 2 MiB.
        let used = on_deep_stack("sluice-test", || {
            let top = 0u8;
            use_stack(std::ptr::addr_of!(top) as usize, 12 << 20)
        });
        assert!(used.unwrap() >= 12 << 20);
        let name = on_deep_stack("sluice-test", || {
            std::thread::current().name().map(str::to_string)
        });
        assert_eq!(name.unwrap().as_deref(), Some("sluice-test"));
    }

    #[test]
    fn a_panic_on_a_deep_stack_reaches_the_caller() {
        let caught = std::panic::catch_unwind(|| on_deep_stack("sluice-test", || panic!("boom")));
        let message = caught.unwrap_err();
        assert_eq!(message.downcast_ref::<&str>(), Some(&"boom"));
    }
}
