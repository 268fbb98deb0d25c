//! A tumbling count by 10^5 keys against the same job with `rolling_sum`: the
//! `sequence -> key_by -> keyed operator -> file` job run in process, the sequence's
//! records given an event time (record `i` at `i / 10` ms) and a watermark 10 s behind
//! the highest, on both sides alike.

use async_trait::async_trait;
use lockgate::connector::{
    Batch, CheckpointId, ModuloAssigner, Result, Source, SourceCaps, SourcePoll, SourcePosition,
    SourceSpec, Step, SubtaskInfo,
};
use lockgate::connectors::file_sink::{FileSink, FileSinkConfig};
use lockgate::connectors::sequence::{SequenceConfig, SequenceSource};
use lockgate::dead_letter::OnError;
use lockgate::event_time::{Watermark, END_OF_TIME};
use lockgate::job::{CheckpointSettings, Job, JobBuilder, RestartPolicy};
use lockgate::operators::rolling_sum::{json_key, RollingSum};
use lockgate::operators::window::aggregate::AggSpec;
use lockgate::operators::window::assign::{Timing, WindowKind};
use lockgate::operators::window::operator::WindowOperator;
use lockgate::operators::window::WindowSpec;
use lockgate::runtime::{run, RunOptions};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

/// The sequence source with an event time per record and a watermark.
struct Timed {
    inner: SequenceSource,
    max: i64,
    finished: bool,
}

#[async_trait]
impl Source for Timed {
    async fn open(
        &mut self,
        info: &SubtaskInfo,
        restored: Option<&[SourcePosition]>,
    ) -> Result<()> {
        self.inner.open(info, restored).await
    }

    async fn poll(&mut self, out: &mut Batch) -> Result<SourcePoll> {
        let before = out.len();
        let r = self.inner.poll(out).await?;
        for rec in &mut out[before..] {
            let t = rec.origin.as_ref().map_or(0, |o| o.offset / 10);
            rec.timestamp = Some(t);
            self.max = self.max.max(t);
        }
        self.finished |= r == SourcePoll::Finished;
        Ok(r)
    }

    fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<SourcePosition>> {
        self.inner.snapshot(id)
    }

    fn watermark(&mut self) -> Option<Watermark> {
        Some(if self.finished {
            Watermark::At(END_OF_TIME)
        } else {
            Watermark::At(self.max - 10_000)
        })
    }
}

fn builder(dir: &std::path::Path, records: i64, keys: u32) -> JobBuilder {
    let seq = SequenceConfig {
        from: 1,
        to: records,
        keys,
        rate_per_sec: 0,
        splits: 128,
    };
    let source = SourceSpec::new("sequence", move |_| {
        Box::new(Timed {
            inner: SequenceSource::new(seq.clone()),
            max: i64::MIN,
            finished: false,
        })
    })
    .assigned_by(ModuloAssigner)
    .with_caps(SourceCaps {
        bounded: true,
        discovers_splits: false,
    });
    let mut chk = CheckpointSettings::new(dir.join("checkpoints"));
    chk.interval_ms = 1000;
    Job::builder("bench")
        .parallelism(2)
        .restart(RestartPolicy::None)
        .checkpointing(chk)
        .source_spec(source)
        .key_by(|r| json_key(r, "/key"))
}

/// Records per second of one run of either side.
fn run_once(window: bool, records: i64, keys: u32) -> f64 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let b = builder(tmp.path(), records, keys);
    let b = if window {
        let spec = Arc::new(WindowSpec {
            kind: WindowKind::Tumbling { size: 60_000 },
            key: "/key".into(),
            aggregates: vec![("orders".into(), AggSpec::Count)],
            timing: Timing {
                lateness: 0,
                emit_final: true,
                late_updates: false,
            },
            late: OnError::Skip,
            on_error: OnError::Fail,
        });
        b.step(Step::Keyed {
            kind: "window".into(),
            uid: "window-0".into(),
            factory: Arc::new(move |_| Box::new(WindowOperator::new(spec.clone(), None))),
            across_partitions: false,
        })
    } else {
        b.keyed("rolling_sum", "sum", |_| RollingSum {
            field: "/value".into(),
            output: "/total".into(),
        })
    };
    let g = b
        .sink_spec(FileSink::spec(FileSinkConfig::json(tmp.path().join("out"))))
        .build()
        .expect("valid job");
    let start = Instant::now();
    super::checkpoints::runtime()
        .block_on(run(&g, RunOptions::default()))
        .expect("job runs");
    records as f64 / start.elapsed().as_secs_f64()
}

/// Both sides, alternating, `rounds` times; medians and their ratio.
pub fn measure(records: i64, keys: u32, rounds: usize) -> serde_json::Value {
    let (mut win, mut sum) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let w = run_once(true, records, keys);
        let s = run_once(false, records, keys);
        eprintln!("round {round}: tumbling count {w:.0} rec/s, rolling_sum {s:.0} rec/s");
        win.push(w);
        sum.push(s);
    }
    let (w, s) = (super::median(win), super::median(sum));
    json!({
        "benchmark": "sequence -> key_by -> tumbling count (1 min) | rolling_sum -> file, parallelism 2, checkpoints every second",
        "records": records,
        "keys": keys,
        "rounds": rounds,
        "records_per_sec_tumbling_count": w.round(),
        "records_per_sec_rolling_sum": s.round(),
        "ratio_window_over_rolling_sum": (w / s * 1000.0).round() / 1000.0,
    })
}
