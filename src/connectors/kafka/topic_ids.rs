//! Kafka topic ids, and what a changed one means for restored positions.
//!
//! A topic deleted and created again under the same name is another topic: its offsets
//! start over, so positions, bounded ends and upstream marks of the old one do not
//! apply to it. The name cannot tell them apart; the topic id (a UUID the cluster gives
//! a topic at creation, Kafka 2.8+) can. The source records each topic's id with its
//! positions in every checkpoint and compares it with the cluster's at restore and at
//! each discovery ([`topic_identity`]).
//!
//! librdkafka's metadata API does not expose topic ids and rdkafka does not wrap its
//! DescribeTopics admin call: [`describe`] makes that call through the client's native
//! handle, on a queue of its own. An all-zero id (a broker that answers Metadata below
//! v10) is reported as unknown, and an unknown id on either side is never a change:
//! the source then behaves as it did before ids were recorded.

use base64::Engine;
use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_char, c_int};
use std::time::{Duration, Instant};

/// A Kafka topic id: 16 bytes, the most significant half first (big endian), as Kafka's
/// `Uuid`. Never all zero (that is "unknown", which is `None` wherever an id is
/// optional).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicId([u8; 16]);

impl TopicId {
    /// The id of these bytes, or `None` for the all-zero (unknown) id.
    pub fn from_bytes(bytes: [u8; 16]) -> Option<TopicId> {
        (bytes != [0; 16]).then_some(TopicId(bytes))
    }

    /// The id of the two halves librdkafka reports, or `None` when both are zero.
    pub fn from_bits(most: i64, least: i64) -> Option<TopicId> {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&most.to_be_bytes());
        b[8..].copy_from_slice(&least.to_be_bytes());
        TopicId::from_bytes(b)
    }

    pub fn bytes(&self) -> [u8; 16] {
        self.0
    }
}

/// Kafka's own spelling (`Uuid.toString()`, as `kafka-topics.sh --describe` shows it):
/// URL-safe base64 without padding, 22 characters.
impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.0))
    }
}

impl fmt::Debug for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TopicId({self})")
    }
}

/// What the source does when a topic's id differs from the one its positions were
/// recorded with (`[source.kafka] on_topic_recreated`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecreatedPolicy {
    /// The job fails, naming the topic and both ids.
    #[default]
    Fail,
    /// The old positions, ends and marks of the topic are dropped (with a warning) and
    /// the new topic is read from EARLIEST.
    Restart,
}

impl RecreatedPolicy {
    /// Parses the job-file form: `fail` or `restart`.
    pub fn parse(s: &str) -> Result<RecreatedPolicy, String> {
        match s {
            "fail" => Ok(RecreatedPolicy::Fail),
            "restart" => Ok(RecreatedPolicy::Restart),
            other => Err(format!("`{other}` is not one of fail, restart")),
        }
    }
}

/// What positions recorded with one topic id mean for the topic the cluster has now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// The positions apply: the same topic, or one side's id is unknown (then nothing
    /// can tell, and the source behaves as it did before ids were recorded).
    Same,
    /// The topic was recreated and the policy says to fail.
    Recreated { was: TopicId, now: TopicId },
    /// The topic was recreated and the policy says to start over: drop the old
    /// positions and read the new topic from EARLIEST.
    StartOver { was: TopicId, now: TopicId },
}

/// Whether positions recorded with `recorded` apply to the topic whose id is `now`.
pub fn topic_identity(
    recorded: Option<TopicId>,
    now: Option<TopicId>,
    policy: RecreatedPolicy,
) -> Identity {
    match (recorded, now) {
        (Some(was), Some(now)) if was != now => match policy {
            RecreatedPolicy::Fail => Identity::Recreated { was, now },
            RecreatedPolicy::Restart => Identity::StartOver { was, now },
        },
        _ => Identity::Same,
    }
}

/// The error of [`Identity::Recreated`]: names the topic, both ids and the way out.
pub fn recreated_message(topic: &str, was: TopicId, now: TopicId) -> String {
    format!(
        "topic `{topic}` was recreated: the checkpoint's positions belong to topic id {was}, \
         the cluster's `{topic}` has topic id {now} (deleted and created again: its offsets \
         start over, so the checkpointed offsets do not apply to it). Set \
         `on_topic_recreated = \"restart\"` in [source.kafka] to drop the old positions and \
         read the new topic from EARLIEST, or point the job at the cluster that holds the \
         old topic"
    )
}

/// Frees a librdkafka object when dropped.
struct Owned<T>(*mut T, unsafe extern "C" fn(*mut T));

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: `self.0` came from the librdkafka constructor that `self.1`
            // destroys, is owned by this guard only, and is destroyed once.
            unsafe { (self.1)(self.0) }
        }
    }
}

/// The ids of `topics` (distinct names) as the cluster reports them now: `None` for a
/// topic whose id is unknown (all zero, or the topic reported with an error). An error
/// is the call itself failing (no answer within `timeout`, the request refused). Blocks
/// up to `timeout`; call it off the runtime threads.
///
/// The request (a Metadata request, which any broker answers) goes to `broker` when
/// given, else to the controller, as every admin request does by default: give the
/// broker that just answered a metadata request, so that the call does not wait on a
/// controller the client has not seen (librdkafka's mock cluster reports none).
pub fn describe<C: ClientContext>(
    client: &Client<C>,
    topics: &[String],
    broker: Option<i32>,
    timeout: Duration,
) -> Result<BTreeMap<String, Option<TopicId>>, String> {
    let mut out = BTreeMap::new();
    if topics.is_empty() {
        return Ok(out);
    }
    let names = topics
        .iter()
        .map(|t| CString::new(t.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| "a topic name holds a NUL byte".to_string())?;
    let mut ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    // librdkafka takes request timeouts up to an hour.
    let timeout_ms = c_int::try_from(timeout.as_millis().min(3_600_000)).unwrap_or(c_int::MAX);
    let rk = client.native_ptr();
    // SAFETY: `rk` is valid while `client` is borrowed, which outlives this function.
    // Each object created here is owned by an `Owned` guard that destroys it once, after
    // every pointer into it is gone: the descriptions live as long as the event, which
    // is dropped after they are read. librdkafka copies the topic names into the
    // collection, and the collection and options into the request, so `names` and the
    // guards may go before the request completes; the request holds its own reference
    // to the reply queue, so dropping ours after a timeout is safe.
    unsafe {
        let queue = Owned(rd::rd_kafka_queue_new(rk), rd::rd_kafka_queue_destroy);
        let collection = Owned(
            rd::rd_kafka_TopicCollection_of_topic_names(ptrs.as_mut_ptr(), ptrs.len()),
            rd::rd_kafka_TopicCollection_destroy,
        );
        let options = Owned(
            rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
            ),
            rd::rd_kafka_AdminOptions_destroy,
        );
        if queue.0.is_null() || collection.0.is_null() || options.0.is_null() {
            return Err("describe topics: librdkafka could not create the request".into());
        }
        let mut errstr = [0 as c_char; 512];
        let err = rd::rd_kafka_AdminOptions_set_request_timeout(
            options.0,
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let why = CStr::from_ptr(errstr.as_ptr()).to_string_lossy();
            return Err(format!("describe topics: request timeout: {why}"));
        }
        if let Some(broker) = broker {
            let err = rd::rd_kafka_AdminOptions_set_broker(
                options.0,
                broker,
                errstr.as_mut_ptr(),
                errstr.len(),
            );
            if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                let why = CStr::from_ptr(errstr.as_ptr()).to_string_lossy();
                return Err(format!("describe topics: broker {broker}: {why}"));
            }
        }
        rd::rd_kafka_DescribeTopics(rk, collection.0, options.0, queue.0);
        // The result is the only event this queue receives; the margin lets the
        // request's own timeout answer first, with its error.
        let deadline = Instant::now() + timeout + Duration::from_secs(1);
        let event = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "describe topics: no answer within {} ms",
                    timeout.as_millis()
                ));
            }
            let ev = rd::rd_kafka_queue_poll(
                queue.0,
                c_int::try_from(left.as_millis()).unwrap_or(c_int::MAX),
            );
            if ev.is_null() {
                continue;
            }
            let ev = Owned(ev, rd::rd_kafka_event_destroy);
            if rd::rd_kafka_event_type(ev.0) == rd::RD_KAFKA_EVENT_DESCRIBETOPICS_RESULT as c_int {
                break ev;
            }
        };
        if rd::rd_kafka_event_error(event.0) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            let why = rd::rd_kafka_event_error_string(event.0);
            let why = if why.is_null() {
                "unknown error".into()
            } else {
                CStr::from_ptr(why).to_string_lossy()
            };
            return Err(format!("describe topics: {why}"));
        }
        let result = rd::rd_kafka_event_DescribeTopics_result(event.0);
        if result.is_null() {
            return Err("describe topics: the answer holds no result".into());
        }
        let mut count = 0usize;
        let descriptions = rd::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        for i in 0..count {
            let d = *descriptions.add(i);
            if d.is_null() {
                continue;
            }
            let name = rd::rd_kafka_TopicDescription_name(d);
            if name.is_null() {
                continue;
            }
            let name = CStr::from_ptr(name).to_string_lossy().into_owned();
            let error = rd::rd_kafka_TopicDescription_error(d);
            let failed = !error.is_null()
                && rd::rd_kafka_error_code(error)
                    != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
            let uuid = rd::rd_kafka_TopicDescription_topic_id(d);
            let id = if failed || uuid.is_null() {
                None
            } else {
                TopicId::from_bits(
                    rd::rd_kafka_Uuid_most_significant_bits(uuid),
                    rd::rd_kafka_Uuid_least_significant_bits(uuid),
                )
            };
            out.insert(name, id);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_id_is_a_recreated_topic_and_an_unknown_one_is_never_a_change() {
        let a = TopicId::from_bits(1, 2);
        let b = TopicId::from_bits(3, 4);
        let (x, y) = (a.unwrap(), b.unwrap());
        use Identity::*;
        use RecreatedPolicy::*;
        // (recorded, now, policy, decision)
        let table = [
            (None, None, Fail, Same),
            (None, None, Restart, Same),
            // An older checkpoint (or a broker without ids back then): the id is adopted.
            (None, b, Fail, Same),
            (None, b, Restart, Same),
            // The cluster does not report an id now: nothing can tell.
            (a, None, Fail, Same),
            (a, None, Restart, Same),
            (a, a, Fail, Same),
            (a, a, Restart, Same),
            (a, b, Fail, Recreated { was: x, now: y }),
            (a, b, Restart, StartOver { was: x, now: y }),
            (b, a, Fail, Recreated { was: y, now: x }),
        ];
        for (recorded, now, policy, want) in table {
            assert_eq!(
                topic_identity(recorded, now, policy),
                want,
                "{recorded:?} -> {now:?} under {policy:?}"
            );
        }
    }

    #[test]
    fn ids_are_big_endian_halves_spelled_as_kafka_does() {
        // Kafka's Uuid(most, least).toString() of these halves.
        let id = TopicId::from_bits(0x0102_0304_0506_0708, -1).unwrap();
        assert_eq!(
            id.bytes(),
            [1, 2, 3, 4, 5, 6, 7, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        );
        assert_eq!(id.to_string(), "AQIDBAUGBwj__________w");
        assert_eq!(TopicId::from_bytes(id.bytes()), Some(id));
        assert_eq!(TopicId::from_bits(0, 0), None);
        assert_eq!(TopicId::from_bytes([0; 16]), None);
    }

    #[test]
    fn the_policy_parses_fail_and_restart_only() {
        assert_eq!(RecreatedPolicy::parse("fail"), Ok(RecreatedPolicy::Fail));
        assert_eq!(
            RecreatedPolicy::parse("restart"),
            Ok(RecreatedPolicy::Restart)
        );
        assert!(RecreatedPolicy::parse("earliest").is_err());
        assert_eq!(RecreatedPolicy::default(), RecreatedPolicy::Fail);
    }

    #[test]
    fn the_error_names_the_topic_both_ids_and_the_key() {
        let (a, b) = (
            TopicId::from_bits(1, 1).unwrap(),
            TopicId::from_bits(2, 2).unwrap(),
        );
        let m = recreated_message("orders", a, b);
        for part in [
            "`orders` was recreated",
            &a.to_string(),
            &b.to_string(),
            "on_topic_recreated",
        ] {
            assert!(m.contains(part), "{part:?} in {m}");
        }
    }
}
