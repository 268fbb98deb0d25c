"""The demo's job written with Quix Streams: Kafka topic `orders` -> by user -> a
rolling sum of `amount` in Quix's state -> Elasticsearch, one document per user
(`{"user": ..., "total": ...}`, id the user) in the index `user-totals`, exactly-once.

By user: Quix keeps state by message key. The sample orders are keyed by their user, so
by default the job sums by message key and fails on a record whose key is not its user
(`--key message`). `--key group-by` re-keys by the `user` field through a repartition
topic (`group_by`), as a topic keyed otherwise would need.

Bounded as lockgate's job file is (`bounded = "latest"`): it reads the end offsets of
`orders` when it starts and stops (with a final checkpoint) once the rolling sum has
seen that many records.

    python quix_job.py --kafka HOST:PORT --es http://HOST:PORT --state-dir DIR
"""

import argparse
import logging
import sys

from confluent_kafka import Consumer, TopicPartition
from quixstreams import Application
from quixstreams.models.topics import TopicAdmin, TopicConfig, TopicManager
from quixstreams.sinks.community.elasticsearch import ElasticsearchSink


KAFKA_DEFAULT_RETENTION = {"retention.ms": "604800000", "retention.bytes": "-1"}


class MetadataTopicAdmin(TopicAdmin):
    """Quix's topic admin without the admin API: lockgate's embedded Kafka (librdkafka's
    mock cluster) answers Metadata but neither DescribeConfigs nor CreateTopics. Topics
    are described from metadata (partitions, replicas) with Kafka's default retention
    (what Quix copies onto the topics it derives), and a topic
    that does not exist is an error naming it: start the embedded Kafka with
    `--topic NAME:PARTITIONS` for each (the compare script does)."""

    def inspect_topics(self, topic_names, timeout=30):
        cluster = self.list_topics(timeout=timeout)
        return {
            name: (
                TopicConfig(
                    num_partitions=len(cluster[name].partitions),
                    replication_factor=len(cluster[name].partitions[0].replicas),
                    extra_config=dict(KAFKA_DEFAULT_RETENTION),
                )
                if name in cluster and cluster[name].partitions
                else None
            )
            for name in topic_names
        }

    def create_topics(self, topics, timeout=30, finalize_timeout=60):
        existing = self.list_topics(timeout=timeout)
        missing = [
            f"{t.name}:{t.create_config.num_partitions if t.create_config else '?'}"
            for t in topics
            if t.name not in existing
        ]
        if missing:
            sys.exit(
                "error: the Kafka cluster cannot create topics; create them first: "
                + " ".join(f"--topic {m}" for m in missing)
            )


def records_at_start(bootstrap, topic):
    """How many records `topic` holds now (the sum of its partitions' end offsets
    minus their start offsets)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "orders-to-es-quix-probe"})
    try:
        meta = c.list_topics(topic, timeout=30)
        parts = meta.topics[topic].partitions
        if not parts:
            sys.exit(f"error: topic {topic} has no partitions")
        total = 0
        for p in parts:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            total += high - low
        return total
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kafka", required=True)
    ap.add_argument("--es", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--topic", default="orders")
    ap.add_argument("--index", default="user-totals")
    ap.add_argument(
        "--guarantee", default="exactly-once", choices=["exactly-once", "at-least-once"]
    )
    ap.add_argument("--key", default="message", choices=["message", "group-by"])
    ap.add_argument(
        "--commit-interval",
        type=float,
        default=1.0,
        help="seconds between checkpoints (lockgate's job file: 1 s)",
    )
    args = ap.parse_args()

    expected = records_at_start(args.kafka, args.topic)
    print(f"quix job: {expected} records in {args.topic} at start", file=sys.stderr)

    app = Application(
        broker_address=args.kafka,
        consumer_group="orders-to-es-quix",
        auto_offset_reset="earliest",
        processing_guarantee=args.guarantee,
        commit_interval=args.commit_interval,
        state_dir=args.state_dir,
        auto_create_topics=True,
        loglevel="WARNING",
        topic_manager=TopicManager(
            topic_admin=MetadataTopicAdmin(broker_address=args.kafka),
            consumer_group="orders-to-es-quix",
        ),
    )
    orders = app.topic(args.topic, key_deserializer="str", value_deserializer="json")
    sdf = app.dataframe(orders)
    if args.key == "group-by":
        sdf = sdf.group_by("user")

    def rolling_sum(value, key, _timestamp, _headers, state):
        if key != value["user"]:
            raise ValueError(f"record keyed {key!r} is the order of {value['user']!r}")
        total = state.get("total", 0) + value["amount"]
        state.set("total", total)
        return {"user": value["user"], "total": total}

    sdf = sdf.apply(rolling_sum, stateful=True, metadata=True)

    seen = 0

    def count(_value):
        # After the last record the topic held at start: stop, which takes a final
        # checkpoint (the sink flushes, the transaction commits) before run() returns.
        nonlocal seen
        seen += 1
        if seen == expected:
            app.stop()

    sdf = sdf.update(count)
    sdf.sink(
        ElasticsearchSink(
            url=args.es,
            index=args.index,
            document_id_setter=lambda item: item.value["user"],
        )
    )
    if expected == 0:
        return
    app.run()
    print(f"quix job: {seen} records through the rolling sum", file=sys.stderr)
    if seen < expected:
        sys.exit(f"error: stopped after {seen} of {expected} records")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
