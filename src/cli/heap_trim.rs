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
//!
//! glibc also opens up to eight arenas per core, one per thread that meets a locked
//! one, and each keeps its own free pages and fragments: capped at two (unless the
//! operator set `MALLOC_ARENA_MAX`), the demo's job peaked 5 to 10 MiB lower at 10^6
//! records, at the same speed, since a job's threads spend their time in I/O and in
//! batches, not in the allocator.

use std::time::Duration;

/// How often the heap is trimmed: often enough that resident memory follows what a
/// job holds between checkpoints, rarely enough that the arena locks it takes cost
/// nothing measurable.
pub const INTERVAL: Duration = Duration::from_millis(250);

/// The arenas glibc may open, unless `MALLOC_ARENA_MAX` says otherwise.
pub const ARENA_MAX: i32 = 2;

/// Caps glibc's arenas at [`ARENA_MAX`] (unless `MALLOC_ARENA_MAX` is set) and starts
/// a thread that trims the heap every [`INTERVAL`] for the life of the process (once,
/// however often it is called). Called before the runtime starts its threads, so that
/// no thread has opened an arena of its own yet. A no-op where the C library is not
/// glibc.
pub fn start() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    static STARTED: std::sync::Once = std::sync::Once::new();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    STARTED.call_once(|| {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            // SAFETY: mallopt takes no pointers; it is called before the runtime's
            // threads exist.
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX);
            }
        }
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
