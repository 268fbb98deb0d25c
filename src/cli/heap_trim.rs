//! Gives the heap's free pages back to the kernel while a job runs.
//!
//! glibc's allocator keeps what a thread frees in that thread's arena for reuse, and
//! returns memory to the kernel only from the top of each arena. A job's threads
//! (tokio workers, RocksDB and librdkafka threads) free in one arena what they
//! allocated in another, so the process kept tens of MiB of free, fragmented pages:
//! the demo's job had about 20 MiB of live heap and 50 MiB of resident anonymous
//! memory over a backlog of 10^6 records. `malloc_trim(0)` releases the free pages
//! inside every arena (glibc 2.8 and later), so four times a second the process's
//! resident size is brought back to what it holds, not what it once held. Each trim
//! takes every arena's lock in turn: a few microseconds per arena, where a job's batches
//! take milliseconds.

use std::time::Duration;

/// How often the heap is trimmed: often enough that resident memory follows what a
/// job holds between checkpoints, rarely enough that the arena locks it takes cost
/// nothing measurable.
pub const INTERVAL: Duration = Duration::from_millis(250);

/// Starts a thread that trims the heap every [`INTERVAL`] for the life of the process
/// (once, however often it is called). A no-op where the C library is not glibc.
pub fn start() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    static STARTED: std::sync::Once = std::sync::Once::new();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("heap-trim".into())
            .spawn(|| loop {
                std::thread::sleep(INTERVAL);
                // SAFETY: malloc_trim takes no pointers and is thread safe.
                unsafe {
                    libc::malloc_trim(0);
                }
            });
    });
}
