//! What a bulk sink supplies to the kit, in two parts: a [`BulkEncoder`] turns its
//! records into actions (and an action back into what a dead letter carries), a
//! [`BulkTransport`] sends a request of them and says what each answer means. The kit's
//! processor does the rest: batching, the in-flight limit, per-document order, retries,
//! flush at the barrier, the byte bound, metrics, the failure policy
//! ([`super::FailurePolicy`]) and dead letters.

use super::batcher::DocKey;
use super::metrics::ItemLabel;
use super::outcome::{ItemFailure, Outcome, RequestOutcome};
use super::processor::INVALID_DOCUMENT;
use super::Supersedes;
use crate::dead_letter::Reason;
use std::future::Future;

/// What to do with an action the target refused (Flink's ActionRequestFailureHandler).
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<A> {
    /// Send these actions instead (for example the document re-routed elsewhere). They
    /// take the refused action's place in its document's order and count its attempts.
    Requeue(Vec<A>),
    /// Write the original record and the error to this Kafka topic; the action is
    /// resolved once the broker acknowledged the letter.
    DeadLetter(String),
    /// Fail the job with this message.
    Fail(String),
    /// Give the action up, deliberately (counted and logged at WARN).
    Drop,
}

/// An action ready for the batcher: the item, its document, its effect on it.
pub struct Encoded<T: BulkEncoder + ?Sized> {
    pub item: T::Item,
    /// The document the action is on (`None`: no order to keep).
    pub doc: Option<DocKey>,
    pub effect: T::Effect,
    /// Its request lines and any copy of its record it keeps: what a request's
    /// `max_bytes` counts for it. `buffer_max_bytes` counts these plus the processor's
    /// bookkeeping for the action ([`super::bookkeeping_bytes`]), which the encoder adds
    /// to its batch's `bytes`.
    pub bytes: usize,
}

/// One action as the encoder made it: ready for the batcher, or not sendable at all
/// (its record has no valid id, say), and why. The second goes to the failure policy
/// as if the target had refused it.
pub enum Added<T: BulkEncoder + ?Sized> {
    Encoded(Encoded<T>),
    Invalid(T::Action, String),
}

/// The actions of one batch of records, handed to the processor at once.
pub struct EncodedBatch<T: BulkEncoder + ?Sized> {
    pub actions: Vec<Added<T>>,
    /// What `buffer_max_bytes` counts for them.
    pub bytes: usize,
}

/// What came back for one request, read by the target's protocol.
#[derive(Debug)]
pub enum Sent {
    /// Every item written. `items` is how many item results came back (a count that
    /// differs from the request's retries it whole); `by_label` counts them by the
    /// outcome label they are reported under, indexed by [`ItemLabel`].
    Written {
        items: usize,
        by_label: [usize; ItemLabel::ALL.len()],
    },
    /// One result per item, in request order: status, error type, reason.
    Items(Vec<(u16, Option<String>, Option<String>)>),
    /// No item results: the status (`None`: no answer at all, a connection error) and
    /// why.
    Request(Option<u16>, String),
}

/// What a dead letter of an action carries besides its error and reason: the record
/// as it came, and where it came from and was going.
#[derive(Debug, Clone, Copy, Default)]
pub struct LetterParts<'a> {
    /// The record (or, if it kept none, the action's body).
    pub payload: &'a [u8],
    pub key: Option<&'a [u8]>,
    /// The source record's coordinates (stream, partition, offset), if known.
    pub origin: Option<(&'a str, i32, i64)>,
    /// Where it was going: the index (table, collection) and the document id.
    pub target: Option<(&'a str, &'a str)>,
}

/// Records to actions and back: what a bulk sink's protocol looks like on the way out.
/// Called from the processor's one task; nothing is called per item through a pointer
/// (the processor is generic over it).
pub trait BulkEncoder: Send + Sync + 'static {
    /// One encoded action, as the batcher holds it until it is resolved.
    type Item: Send + Sync + 'static;
    /// What an action does to its document (which later actions make it irrelevant).
    type Effect: Supersedes + Send + Sync + 'static;
    /// An action in full, as the failure policy sees it and requeues it.
    type Action: Send + Sync + 'static;

    /// Encodes actions (replacements the failure policy requeued).
    fn encode(&self, actions: Vec<Self::Action>) -> EncodedBatch<Self>;

    /// The action an item was made of, in full.
    fn action(&self, item: &Self::Item) -> Self::Action;

    /// The action, for messages.
    fn describe(&self, action: &Self::Action) -> String;

    /// An item kept a while after its request (retried, refused) no longer holds its
    /// request's buffer alive. By default an item holds nothing to let go of.
    fn unpin(&self, _item: &mut Self::Item) {}

    /// What the dead letter of `action` carries.
    fn letter<'a>(&self, action: &'a Self::Action) -> LetterParts<'a>;
}

/// Requests and what their answers mean: the wire of a bulk sink, over the encoder's
/// items `I`. Called from the processor's one task, as the encoder is.
pub trait BulkTransport<I>: Send + Sync + 'static {
    /// The system's name, for messages ("Elasticsearch refused ...").
    fn system(&self) -> &'static str;

    /// How many nodes requests may go to (at least 1); the processor spreads requests
    /// over them and sets a node that does not answer aside for a while.
    fn nodes(&self) -> usize;

    /// Builds one request of `items` (in this order, each document's actions in the
    /// order given) for node `node`: the bytes it sends, and the answer to come. The
    /// future owns what it needs; it is polled by the processor's task.
    fn send(
        &self,
        node: usize,
        items: &[&I],
    ) -> (usize, impl Future<Output = Sent> + Send + 'static);

    /// What one item result means, and the outcome label it is counted under (`None`
    /// for a refused or fatal one: counted when the failure policy settles it).
    fn classify(
        &self,
        item: &I,
        status: u16,
        error_type: Option<&str>,
    ) -> (Outcome, Option<ItemLabel>);

    /// What a request that returned no item results means.
    fn classify_request(&self, status: Option<u16>) -> RequestOutcome;

    /// The message of a failure no restart can cure (refused credentials) in what came
    /// back from `node`, if it is one: the job then fails without restarting. By
    /// default there is none.
    fn unrecoverable(&self, _node: usize, _sent: &Sent) -> Option<String> {
        None
    }

    /// The `reason` label of a refused item's dead letter. By default: the kit's own
    /// refusals by theirs (an action that could not be encoded, one too large to
    /// send), anything else `rejected`.
    fn reason(&self, failure: &ItemFailure) -> Reason {
        match failure.error_type.as_str() {
            INVALID_DOCUMENT => Reason::InvalidDocument,
            ItemFailure::TOO_LARGE => Reason::TooLarge,
            _ => Reason::Rejected,
        }
    }
}
