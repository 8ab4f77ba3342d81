//! Panics that Sluice catches and reports as errors stay off stderr.
//!
//! Some code Sluice runs can panic on hostile input: a Parquet reader or DataFusion on a
//! corrupt file, an image decoder, the IPC decoder on a corrupt message. Sluice catches
//! those panics and reports each once, as the error it is (`Execution`, `Corrupt`, a
//! row's error). Without more, Rust's default panic hook would first print "thread …
//! panicked at …" to stderr, so a user would see the failure twice, once as a crash.
//!
//! [`install_quiet_hook`] (called once by the `sluice` binary and the Python module)
//! wraps the process's panic hook: a panic inside [`catch`], or on a thread of a Sluice
//! runtime (named with [`RUNTIME_THREAD_PREFIX`], where every task's panic is caught
//! where it is joined), is not printed; its message and location are kept for the
//! error that reports it. Any other panic goes to the previous hook as before, and
//! `SLUICE_LOG` containing `debug` prints the quiet ones too.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::sync::Once;

/// Threads of Sluice's tokio runtimes are named with this prefix.
pub const RUNTIME_THREAD_PREFIX: &str = "sluice-rt";

thread_local! {
    /// How many [`catch`] calls this thread is inside.
    static CATCHING: Cell<u32> = const { Cell::new(0) };
    /// The message and location of the last quiet panic of this thread.
    static LAST: RefCell<Option<(String, String)>> = const { RefCell::new(None) };
}

/// Installs the quiet hook (once per process; later calls do nothing).
pub fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        let verbose = std::env::var("SLUICE_LOG").is_ok_and(|v| v.contains("debug"));
        std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            if is_quiet() && !verbose {
                let last = info.location().map(|l| {
                    (
                        message(info.payload()),
                        format!("{}:{}", l.file(), l.line()),
                    )
                });
                LAST.with(|cell| *cell.borrow_mut() = last);
            } else {
                previous(info);
            }
        }));
    });
}

fn is_quiet() -> bool {
    CATCHING.with(Cell::get) > 0
        || std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with(RUNTIME_THREAD_PREFIX))
}

/// Runs `f`, turning a panic into `Err` with its message (and, with the quiet hook
/// installed, where it happened).
pub fn catch<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    CATCHING.with(|c| c.set(c.get() + 1));
    let result = std::panic::catch_unwind(AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(c.get() - 1));
    result.map_err(|panic| describe(panic.as_ref()))
}

/// The message of a caught panic, with where it happened when the quiet hook saw it
/// on this thread (a panic caught on another thread than it happened keeps no
/// location: the one recorded here would be another panic's).
pub fn describe(panic: &(dyn Any + Send)) -> String {
    let message = message(panic);
    match LAST.with(|cell| cell.borrow_mut().take()) {
        Some((seen, location)) if seen == message => format!("{message} (at {location})"),
        _ => message,
    }
}

fn message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The child half of `a_caught_panic_prints_nothing`: with the hook installed, a
    /// panic inside `catch` and one on a runtime-named thread print nothing.
    #[test]
    fn quiet_child() {
        if std::env::var_os("SLUICE_QUIET_CHILD").is_none() {
            return;
        }
        install_quiet_hook();
        let err = catch(|| panic!("boom in catch")).unwrap_err();
        assert!(err.starts_with("boom in catch (at "), "{err}");
        assert!(err.contains("panics.rs"), "{err}");
        let joined = std::thread::Builder::new()
            .name(format!("{RUNTIME_THREAD_PREFIX}-worker"))
            .spawn(|| panic!("boom on a runtime thread"))
            .unwrap()
            .join();
        assert!(joined.is_err());
    }

    /// A panic Sluice catches is reported once, as an error, with no "panicked at" on
    /// stderr (issue 13): checked in a child process running `quiet_child`.
    #[test]
    fn a_caught_panic_prints_nothing() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "panics::tests::quiet_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SLUICE_QUIET_CHILD", "1")
            .env_remove("SLUICE_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "{stdout}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!stdout.contains("panicked"), "{stdout}");
    }

    #[test]
    fn catch_returns_the_value_when_nothing_panics() {
        assert_eq!(catch(|| 7), Ok(7));
    }
}
