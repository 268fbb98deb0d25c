//! A reading thread and a bounded hand-over (Flink's `SplitFetcher` and `Handover`):
//! how a source keeps blocking reads out of [`Source::poll`](crate::connector::Source).
//!
//! `poll` runs on the runtime's tasks, beside every other subtask of the process: a
//! read that blocks there (a file, a client library's synchronous call) stalls them
//! all. A source built on this kit reads on a thread of its own, which hands batches to
//! `poll` through a channel of at most `queued` batches; `poll` only waits a bounded
//! moment for the next one. When the channel is full the thread waits too, so
//! backpressure stops reading instead of growing memory: the kit holds at most
//! `queued` batches, plus the one the thread is building, beyond what the job is
//! processing. The bytes of the batches waiting in the channel are reported as
//! `lockgate_buffered_bytes{stage="source"}` ([`Fetcher::report_to`]).
//!
//! Two ways to run the thread:
//! - [`Fetcher::start`] with a [`Reader`]: the kit runs the loop, calling
//!   [`Reader::read`] until the source goes away, the reader is finished or it fails;
//! - [`Fetcher::spawn`] with a closure given the thread's end of the hand-over
//!   ([`Feed`]), for a reader that keeps borrowed state of its own across batches.
//!
//! Positions: the thread reads ahead of what the job has taken, so a source must not
//! snapshot the positions its reader reached. [`Positioned`] batches carry the
//! position each split reaches after their records, and [`Emitted`] keeps the
//! positions of what `poll` has handed to the job: what `snapshot` returns.

use crate::connector::SubtaskInfo;
use crate::record::{Batch, Record};
use crate::telemetry::metrics::{Buffered, Stage};
use lockgate_state::SourcePosition;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What the reading thread hands over: something that knows the memory it holds.
pub trait Held: Send + 'static {
    /// The bytes this batch keeps alive while it waits in the hand-over.
    fn held_bytes(&self) -> usize;
}

/// What `poll` takes from the hand-over.
#[derive(Debug)]
pub enum Handover<B> {
    /// The next batch, in the order the thread read them.
    Batch(B),
    /// The reader has read everything it owns (a bounded source): no batch follows.
    Finished,
    /// An error the job cannot continue past; no batch follows.
    Fatal(String),
}

/// The reading side of a source, run on a thread of its own: blocking I/O lives here,
/// never in `poll`.
pub trait Reader: Send + 'static {
    /// What one read hands over.
    type Batch: Held;

    /// The next batch, waiting at most about `wait` for one; `Ok(None)`: nothing yet.
    /// An error stops the reader and fails the source's next `poll` with it.
    fn read(&mut self, wait: Duration) -> Result<Option<Self::Batch>, String>;

    /// Nothing more will come: a bounded reader read everything it owns. Asked after a
    /// read that returned `Ok(None)`.
    fn finished(&self) -> bool {
        false
    }

    /// The thread stops (the source closed, failed or finished): release what the
    /// reader holds. Called once, on the reading thread.
    fn stop(&mut self) {}
}

/// The reading thread's end of the hand-over.
pub struct Feed<B> {
    tx: mpsc::Sender<Handover<B>>,
    queued: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl<B: Held> Feed<B> {
    /// Hands `batch` over, waiting while `queued` batches wait already (backpressure).
    /// `false`: the source is gone, stop reading.
    pub fn send(&self, batch: B) -> bool {
        // Counted before the send, so that the taker never takes off more than was added.
        let held = batch.held_bytes();
        self.queued.fetch_add(held, Ordering::Relaxed);
        if self.tx.blocking_send(Handover::Batch(batch)).is_err() {
            self.queued.fetch_sub(held, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Says that no batch follows (after every batch already sent).
    pub fn finish(self) {
        let _ = self.tx.blocking_send(Handover::Finished);
    }

    /// Fails the source with `why` (after every batch already sent).
    pub fn fail(self, why: String) {
        let _ = self.tx.blocking_send(Handover::Fatal(why));
    }

    /// Whether the source asked the thread to stop (it was dropped).
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// The receiving end of a reading thread, held by the source. Dropping it stops the
/// thread (at its next read or hand-over).
pub struct Fetcher<B> {
    rx: mpsc::Receiver<Handover<B>>,
    stop: Arc<AtomicBool>,
    queued: Arc<AtomicUsize>,
    name: String,
}

impl<B: Held> Fetcher<B> {
    /// Runs `run` on a thread named `name`, handing over at most `queued` batches
    /// ahead of `poll`. The thread ends when `run` returns; if it returns without
    /// [`Feed::finish`] or [`Feed::fail`] while the source still waits, the source's
    /// next take fails naming the thread.
    pub fn spawn(
        name: &str,
        queued: usize,
        run: impl FnOnce(Feed<B>) + Send + 'static,
    ) -> std::io::Result<Fetcher<B>> {
        let (tx, rx) = mpsc::channel(queued.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let counted = Arc::new(AtomicUsize::new(0));
        let feed = Feed {
            tx,
            queued: counted.clone(),
            stop: stop.clone(),
        };
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || run(feed))?;
        Ok(Fetcher {
            rx,
            stop,
            queued: counted,
            name: name.to_string(),
        })
    }

    /// Runs `reader` on a thread named `name` (see [`Fetcher::spawn`]): reads until
    /// the source goes away, the reader is [`finished`](Reader::finished) or fails,
    /// then calls [`Reader::stop`].
    pub fn start<R: Reader<Batch = B>>(
        name: &str,
        queued: usize,
        reader: R,
    ) -> std::io::Result<Fetcher<B>> {
        Fetcher::spawn(name, queued, move |feed| read_loop(reader, feed))
    }

    /// Counts the batches waiting in the hand-over in
    /// `lockgate_buffered_bytes{stage="source"}` for as long as this fetcher lives.
    pub fn report_to(&self, info: &SubtaskInfo) {
        let part: Arc<dyn Buffered> = self.queued.clone();
        info.telemetry
            .metrics()
            .count_buffered(Stage::Source, &part);
    }

    /// The bytes of the batches handed over and not yet taken.
    pub fn queued_bytes(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// The next handed-over item, waiting at most `wait`; `None`: nothing came.
    pub async fn next(&mut self, wait: Duration) -> Option<Handover<B>> {
        match tokio::time::timeout(wait, self.rx.recv()).await {
            Ok(Some(h)) => {
                if let Handover::Batch(b) = &h {
                    self.queued.fetch_sub(b.held_bytes(), Ordering::Relaxed);
                }
                Some(h)
            }
            Ok(None) => Some(Handover::Fatal(format!(
                "the reading thread {} stopped",
                self.name
            ))),
            Err(_) => None,
        }
    }
}

impl<B> Drop for Fetcher<B> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes a thread waiting to hand a batch over: its send fails and it stops.
        self.rx.close();
    }
}

/// How long one [`Reader::read`] waits for data before the loop looks at the stop flag.
const READ_WAIT: Duration = Duration::from_millis(100);

fn read_loop<R: Reader>(mut reader: R, feed: Feed<R::Batch>) {
    loop {
        if feed.stopped() {
            break;
        }
        match reader.read(READ_WAIT) {
            Ok(Some(batch)) => {
                if !feed.send(batch) {
                    break;
                }
            }
            Ok(None) if reader.finished() => {
                reader.stop();
                feed.finish();
                return;
            }
            Ok(None) => {}
            Err(why) => {
                reader.stop();
                feed.fail(why);
                return;
            }
        }
    }
    reader.stop();
}

/// Records of one or more splits and the position each of those splits reaches after
/// them: what a simple source's reader hands over.
#[derive(Debug, Default)]
pub struct Positioned {
    /// The records, in the order they were read.
    pub records: Vec<Record>,
    /// The position each split the records came from reaches after them (one entry
    /// per split; a split may also appear with no records, when it ended).
    pub positions: Vec<SourcePosition>,
    /// The bytes the records hold (keys and values), counted by the reader.
    pub bytes: usize,
}

impl Held for Positioned {
    fn held_bytes(&self) -> usize {
        self.bytes + self.records.len() * std::mem::size_of::<Record>()
    }
}

/// The positions of what a source has handed to the job, split by split: what its
/// `snapshot` returns. Only the records of a batch taken with [`Emitted::take`] move a
/// split's position, so a checkpoint never counts what waits in the hand-over.
#[derive(Debug, Default, Clone)]
pub struct Emitted {
    positions: BTreeMap<(String, i32), SourcePosition>,
}

impl Emitted {
    /// The positions the source starts from (restored or fresh): every split it owns at
    /// the start, so that a checkpoint holds them even before one of their records.
    pub fn new(start: impl IntoIterator<Item = SourcePosition>) -> Emitted {
        let mut e = Emitted::default();
        for p in start {
            e.set(p);
        }
        e
    }

    fn set(&mut self, p: SourcePosition) {
        self.positions.insert((p.stream.clone(), p.partition), p);
    }

    /// Appends `batch`'s records to `out` and moves the positions of its splits.
    pub fn take(&mut self, batch: Positioned, out: &mut Batch) {
        out.extend(batch.records);
        for p in batch.positions {
            self.set(p);
        }
    }

    /// The position of split `split` of `stream`, if the source has one.
    pub fn get(&self, stream: &str, split: i32) -> Option<&SourcePosition> {
        self.positions.get(&(stream.to_string(), split))
    }

    /// Every split's position, ordered by stream and split.
    pub fn snapshot(&self) -> Vec<SourcePosition> {
        self.positions.values().cloned().collect()
    }

    /// Whether every split's position reached its end (a bounded source is done).
    pub fn all_ended(&self) -> bool {
        self.positions
            .values()
            .all(|p| p.end.is_some_and(|e| p.next >= e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockgate_state::NextOffset;
    use std::sync::Mutex;

    struct Counted(usize);
    impl Held for Counted {
        fn held_bytes(&self) -> usize {
            self.0
        }
    }

    /// Reads `batches` of the given sizes, then finishes (or fails with `fail`).
    struct Script {
        batches: Vec<usize>,
        fail: Option<String>,
        reads: Arc<AtomicUsize>,
        stopped: Arc<Mutex<bool>>,
    }

    impl Reader for Script {
        type Batch = Counted;
        fn read(&mut self, _wait: Duration) -> Result<Option<Counted>, String> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            if self.batches.is_empty() {
                return match self.fail.take() {
                    Some(why) => Err(why),
                    None => Ok(None),
                };
            }
            Ok(Some(Counted(self.batches.remove(0))))
        }
        fn finished(&self) -> bool {
            self.batches.is_empty()
        }
        fn stop(&mut self) {
            *self.stopped.lock().unwrap() = true;
        }
    }

    fn script(
        batches: Vec<usize>,
        fail: Option<&str>,
    ) -> (Script, Arc<AtomicUsize>, Arc<Mutex<bool>>) {
        let (reads, stopped) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(false)));
        let s = Script {
            batches,
            fail: fail.map(String::from),
            reads: reads.clone(),
            stopped: stopped.clone(),
        };
        (s, reads, stopped)
    }

    async fn wait_for(cond: impl Fn() -> bool) {
        for _ in 0..500 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not met in 5 s");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_come_in_order_then_finished_and_the_reader_is_stopped() {
        let (s, _, stopped) = script(vec![1, 2, 3], None);
        let mut f = Fetcher::start("test-read", 2, s).unwrap();
        let mut got = Vec::new();
        loop {
            match f.next(Duration::from_secs(5)).await {
                Some(Handover::Batch(b)) => got.push(b.0),
                Some(Handover::Finished) => break,
                other => panic!("unexpected {:?}", other.map(|_| ())),
            }
        }
        assert_eq!(got, [1, 2, 3]);
        wait_for(|| *stopped.lock().unwrap()).await;
        assert_eq!(f.queued_bytes(), 0, "everything taken is taken off");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_hand_over_stops_reading_and_counts_what_waits() {
        let (s, reads, _) = script(vec![10; 100], None);
        let mut f = Fetcher::start("test-full", 2, s).unwrap();
        // Two batches wait in the channel and the thread holds a third it cannot hand
        // over: it reads no fourth while nothing is taken.
        wait_for(|| reads.load(Ordering::SeqCst) >= 3).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            reads.load(Ordering::SeqCst),
            3,
            "backpressure stops reading"
        );
        assert_eq!(
            f.queued_bytes(),
            30,
            "the two waiting and the one being handed over"
        );
        let Some(Handover::Batch(_)) = f.next(Duration::from_secs(5)).await else {
            panic!("a batch waits")
        };
        wait_for(|| reads.load(Ordering::SeqCst) == 4).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_error_comes_after_the_batches_read_before_it() {
        let (s, _, stopped) = script(vec![5], Some("disk gone"));
        let mut f = Fetcher::start("test-fail", 2, s).unwrap();
        assert!(matches!(
            f.next(Duration::from_secs(5)).await,
            Some(Handover::Batch(Counted(5)))
        ));
        match f.next(Duration::from_secs(5)).await {
            Some(Handover::Fatal(why)) => assert_eq!(why, "disk gone"),
            other => panic!("expected the error, got {:?}", other.map(|_| ())),
        }
        wait_for(|| *stopped.lock().unwrap()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_fetcher_stops_a_thread_waiting_to_hand_over() {
        let (s, reads, stopped) = script(vec![1; 1000], None);
        let f = Fetcher::start("test-drop", 1, s).unwrap();
        wait_for(|| reads.load(Ordering::SeqCst) >= 2).await;
        drop(f);
        wait_for(|| *stopped.lock().unwrap()).await;
        assert!(reads.load(Ordering::SeqCst) < 1000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thread_that_ends_without_a_word_fails_the_source_naming_it() {
        let mut f: Fetcher<Counted> = Fetcher::spawn("test-quiet", 1, |_feed| {}).unwrap();
        match f.next(Duration::from_secs(5)).await {
            Some(Handover::Fatal(why)) => assert_eq!(why, "the reading thread test-quiet stopped"),
            other => panic!("expected a failure, got {:?}", other.map(|_| ())),
        }
    }

    #[tokio::test]
    async fn nothing_handed_over_within_the_wait_is_none() {
        // A reader that is finished at once hands over Finished, not a batch.
        let (s, _, _) = script(vec![], None);
        let mut f = Fetcher::start("test-none", 1, s).unwrap();
        assert!(matches!(
            f.next(Duration::from_secs(5)).await,
            Some(Handover::Finished)
        ));
        let mut g: Fetcher<Counted> = Fetcher::spawn("test-idle", 1, |feed| {
            while !feed.stopped() {
                std::thread::sleep(Duration::from_millis(5));
            }
        })
        .unwrap();
        assert!(g.next(Duration::from_millis(50)).await.is_none());
    }

    fn at(stream: &str, next: i64, end: Option<i64>) -> SourcePosition {
        SourcePosition::new(stream, 0, NextOffset(next)).with_end(end.map(NextOffset))
    }

    #[test]
    fn emitted_positions_move_only_with_taken_batches_and_keep_untouched_splits() {
        let mut e = Emitted::new([at("a", 0, Some(10)), at("b", 4, Some(8))]);
        let mut out = Vec::new();
        e.take(
            Positioned {
                records: vec![Record::from_value(b"x".to_vec())],
                positions: vec![at("a", 6, Some(10))],
                bytes: 1,
            },
            &mut out,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(
            e.snapshot(),
            vec![at("a", 6, Some(10)), at("b", 4, Some(8))]
        );
        assert!(!e.all_ended());
        e.take(
            Positioned {
                records: vec![],
                positions: vec![at("a", 10, Some(10)), at("b", 8, Some(8)), at("c", 3, None)],
                bytes: 0,
            },
            &mut out,
        );
        assert_eq!(e.get("c", 0), Some(&at("c", 3, None)));
        assert!(!e.all_ended(), "an unbounded split never ends");
        let bounded = Emitted::new([at("a", 10, Some(10)), at("b", 8, Some(8))]);
        assert!(bounded.all_ended());
        assert!(
            Emitted::new([]).all_ended(),
            "no split: nothing left to read"
        );
    }
}
