//! `[[transform]] type = "window"` as written in a job file.

use super::aggregate::AggSpec;
use super::assign::{Timing, WindowKind};
use crate::connector::{
    KeyError, PreparedTransform, SectionContext, Step, TransformFacts, TransformSection,
};
use crate::dead_letter::{Allowed, OnError, USE_FAIL_OR_SKIP};
use crate::record::json_key;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A window transform, checked.
#[derive(Debug, Clone)]
pub struct WindowSpec {
    pub kind: WindowKind,
    /// JSON pointer of the key.
    pub key: String,
    /// Each aggregate by its name in the result.
    pub aggregates: Vec<(String, AggSpec)>,
    /// `timing.late_updates`: `late = "update"` (windows are emitted at their end and
    /// kept for `allowed_lateness_ms`; a late record within it updates its window,
    /// which is emitted again).
    pub timing: Timing,
    /// What becomes of a record that comes after its window is gone (`late`), counted
    /// in each case: [`OnError::Skip`] drops it (`drop`, and `update` past the
    /// lateness), [`OnError::DeadLetter`] writes it to the topic with the reason.
    pub late: OnError,
    /// A record the window cannot read (no event time, a field that is not a
    /// number).
    pub on_error: OnError,
}

impl WindowSpec {
    /// What the contents of its windows depend on: the kind and spans, and the
    /// aggregates in the order they are kept. A checkpoint's windows restore only
    /// into a window of the same fingerprint.
    pub fn fingerprint(&self) -> String {
        let kind = match self.kind {
            WindowKind::Tumbling { size } => format!("tumbling {size}"),
            WindowKind::Hopping { size, slide } => format!("hopping {size}/{slide}"),
            WindowKind::Session { gap } => format!("session {gap}"),
        };
        let aggregates: Vec<String> = self
            .aggregates
            .iter()
            .map(|(name, a)| format!("{name}={a}"))
            .collect();
        format!("{kind}: {}", aggregates.join(", "))
    }
}

/// Windows a record of a hopping window may belong to (`size_ms / slide_ms`).
pub const MAX_HOPS: i64 = 1_000;

/// Names of the result's own fields.
pub const RESERVED: [&str; 4] = ["key", "window_start", "window_end", "window_id"];

/// The section.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowSection {
    kind: String,
    size_ms: Option<u64>,
    slide_ms: Option<u64>,
    gap_ms: Option<u64>,
    key: String,
    #[serde(default)]
    aggregates: BTreeMap<String, String>,
    allowed_lateness_ms: Option<u64>,
    late: Option<String>,
    emit: Option<String>,
    on_error: Option<String>,
}

fn ms(key: &str, v: Option<u64>, kind: &str) -> Result<i64, KeyError> {
    match v {
        None => Err(KeyError::new(key, format!("a {kind} window needs it"))),
        Some(0) => Err(KeyError::new(key, "must be positive")),
        Some(v) => i64::try_from(v).map_err(|_| KeyError::new(key, "is too large")),
    }
}

impl WindowSection {
    /// The checked transform, or the key that is wrong and why.
    pub fn spec(&self, cx: &SectionContext) -> Result<WindowSpec, KeyError> {
        let kind = match self.kind.as_str() {
            "tumbling" => WindowKind::Tumbling {
                size: ms("size_ms", self.size_ms, "tumbling")?,
            },
            "hopping" => {
                let size = ms("size_ms", self.size_ms, "hopping")?;
                let slide = ms("slide_ms", self.slide_ms, "hopping")?;
                if slide > size {
                    return Err(KeyError::new(
                        "slide_ms",
                        format!("{slide} is longer than size_ms ({size}): records between windows would belong to none"),
                    ));
                }
                let hops = (size + slide - 1) / slide;
                if hops > MAX_HOPS {
                    return Err(KeyError::new(
                        "slide_ms",
                        format!("{slide} puts each record in {hops} windows of size_ms {size} (at most {MAX_HOPS})"),
                    ));
                }
                WindowKind::Hopping { size, slide }
            }
            "session" => WindowKind::Session {
                gap: ms("gap_ms", self.gap_ms, "session")?,
            },
            other => {
                return Err(KeyError::new(
                    "kind",
                    format!("`{other}` is not one of tumbling, hopping, session"),
                ))
            }
        };
        let given = [
            (
                "size_ms",
                self.size_ms.is_some(),
                !matches!(kind, WindowKind::Session { .. }),
            ),
            (
                "slide_ms",
                self.slide_ms.is_some(),
                matches!(kind, WindowKind::Hopping { .. }),
            ),
            (
                "gap_ms",
                self.gap_ms.is_some(),
                matches!(kind, WindowKind::Session { .. }),
            ),
        ];
        for (k, is_given, applies) in given {
            if is_given && !applies {
                return Err(KeyError::new(
                    k,
                    format!("does not apply to a {} window", self.kind),
                ));
            }
        }
        if !self.key.starts_with('/') {
            return Err(KeyError::new(
                "key",
                format!("`{}` is not a JSON pointer (it starts with /)", self.key),
            ));
        }
        let mut aggregates = Vec::new();
        for (name, s) in &self.aggregates {
            let at = format!("aggregates.{name}");
            if RESERVED.contains(&name.as_str()) {
                return Err(KeyError::new(
                    &at,
                    format!(
                        "`{name}` is a field of every result ({}): name the aggregate otherwise",
                        RESERVED.join(", ")
                    ),
                ));
            }
            aggregates.push((
                name.clone(),
                AggSpec::parse(s).map_err(|e| KeyError::new(&at, e))?,
            ));
        }
        let lateness = i64::try_from(self.allowed_lateness_ms.unwrap_or(0))
            .map_err(|_| KeyError::new("allowed_lateness_ms", "is too large"))?;
        // `update` is the window's own: a late record within the lateness updates its
        // window, one past it is dropped.
        let (late, late_updates) = match self.late.as_deref() {
            None => (OnError::Skip, false),
            Some("update") => (OnError::Skip, true),
            Some(s) => (
                OnError::parse(s, Allowed::LATE).map_err(|e| KeyError::new("late", e))?,
                false,
            ),
        };
        if late_updates && lateness == 0 {
            return Err(KeyError::new(
                "late",
                "update keeps windows for allowed_lateness_ms after their end, and it is 0: set allowed_lateness_ms",
            ));
        }
        cx.dead_letter_cluster("late", &late, "this source has none: use drop")?;
        let emit_final = match self.emit.as_deref() {
            None | Some("final") => true,
            Some("update") => false,
            Some(other) => {
                return Err(KeyError::new(
                    "emit",
                    format!("`{other}` is not one of final, update"),
                ))
            }
        };
        if !cx.event_time {
            return Err(KeyError::new(
                "type",
                "a window needs event time and watermarks: add [source.kafka.watermark] to the source",
            ));
        }
        Ok(WindowSpec {
            kind,
            key: self.key.clone(),
            aggregates,
            timing: Timing {
                lateness,
                emit_final,
                late_updates,
            },
            late,
            on_error: cx.error_policy(
                "on_error",
                self.on_error.as_deref(),
                Allowed::DECODE,
                USE_FAIL_OR_SKIP,
            )?,
        })
    }
}

impl TransformSection for WindowSection {
    fn prepare(self, cx: &SectionContext, index: usize) -> Result<PreparedTransform, KeyError> {
        let spec = Arc::new(self.spec(cx)?);
        let merges = spec.kind.merges();
        let key = spec.key.clone();
        let uid = format!("{}-{index}", super::KIND);
        let kafka = cx.source_kafka.clone();
        let s = spec.clone();
        Ok(PreparedTransform {
            steps: vec![
                Step::KeyBy(Arc::new(move |r| json_key(r, &key))),
                Step::Keyed {
                    kind: super::KIND.to_string(),
                    uid,
                    factory: Arc::new(move |_| {
                        Box::new(super::operator::WindowOperator::new(
                            s.clone(),
                            kafka.clone(),
                        ))
                    }),
                    across_partitions: false,
                },
            ],
            facts: TransformFacts {
                deletes: merges.then(|| {
                    "session windows, which delete the result of a session merged into another"
                        .to_string()
                }),
                makes_records: Some("a window's results".into()),
            },
            config: spec,
        })
    }
}
