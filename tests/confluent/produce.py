"""Produces records with Confluent's own Schema Registry serializers (confluent-kafka),
so that lockgate's decoders are checked against an independent writer.

    produce.py --bootstrap B --registry URL --topic T --format avro --count N
               [--from I] [--partitions P]

Record i is the same in every format (see order() and the schemas below); its key is
the string "order-<i>", serialized with the same format as the value. Prints the
number of records acknowledged.
"""

import argparse
import datetime
import decimal
import sys

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

UTC = datetime.timezone.utc
EPOCH_MS = 1_700_000_000_000

AVRO_VALUE = """
{"type": "record", "name": "Order", "namespace": "shop",
 "fields": [
  {"name": "id", "type": "long"},
  {"name": "user", "type": "string"},
  {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
  {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "note", "type": ["null", "string"], "default": null},
  {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
  {"name": "address", "type": {"type": "record", "name": "Address",
     "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": "int"}]}},
  {"name": "tags", "type": {"type": "array", "items": "string"}},
  {"name": "attrs", "type": {"type": "map", "values": "long"}},
  {"name": "day", "type": {"type": "int", "logicalType": "date"}}
 ]}
"""


# Version 2 of the value schema: one optional field more (a compatible evolution).
AVRO_VALUE_V2 = AVRO_VALUE.replace(
    '{"name": "day",',
    '{"name": "coupon", "type": ["null", "string"], "default": null},\n  {"name": "day",',
)


def order(i, version=1):
    """Record i, as the serializers take it."""
    extra = {"coupon": f"c{i}"} if version == 2 else {}
    return extra | {
        "id": i,
        "user": f"user-{i % 7}",
        "amount": decimal.Decimal(i * 137 + 5).scaleb(-2),
        "ts": datetime.datetime.fromtimestamp((EPOCH_MS + i * 1000) / 1000, tz=UTC),
        "note": None if i % 3 == 0 else f"note {i}",
        "status": ["NEW", "PAID", "SHIPPED"][i % 3],
        "address": {"city": "Lyon", "zip": 69000 + i % 10},
        "tags": [f"t{i % 2}", "x"],
        "attrs": {"n": i, "m": -i},
        "day": datetime.date(2026, 1, 1) + datetime.timedelta(days=i % 30),
    }


def serializers(fmt, registry, version):
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        schema = AVRO_VALUE if version == 1 else AVRO_VALUE_V2
        value = AvroSerializer(registry, schema, lambda o, ctx: o)
        key = AvroSerializer(registry, '"string"')
        return key, value
    raise SystemExit(f"unknown format {fmt}")


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--bootstrap", required=True)
    a.add_argument("--registry", required=True)
    a.add_argument("--topic", required=True)
    a.add_argument("--format", required=True)
    a.add_argument("--count", type=int, required=True)
    a.add_argument("--from", dest="start", type=int, default=0)
    a.add_argument("--partitions", type=int, default=1)
    a.add_argument("--schema-version", type=int, default=1)
    a.add_argument("--out", help="write hex key and value per line here instead of producing")
    a.add_argument("--register-only", action="store_true",
                   help="register the key schema, then version 1 and 2 of the value schema")
    args = a.parse_args()

    registry = SchemaRegistryClient({"url": args.registry})
    key_ctx = SerializationContext(args.topic, MessageField.KEY)
    value_ctx = SerializationContext(args.topic, MessageField.VALUE)
    if args.register_only:
        for version in (1, 2):
            key_ser, value_ser = serializers(args.format, registry, version)
            key_ser("order-0", key_ctx)
            value_ser(order(0, version), value_ctx)
        print(0)
        return 0
    key_ser, value_ser = serializers(args.format, registry, args.schema_version)
    if args.out:
        with open(args.out, "w") as out:
            for i in range(args.start, args.start + args.count):
                key = key_ser(f"order-{i}", key_ctx)
                value = value_ser(order(i, args.schema_version), value_ctx)
                out.write(f"{key.hex()}\t{value.hex()}\n")
        print(args.count)
        return 0
    producer = Producer({"bootstrap.servers": args.bootstrap, "acks": "all", "linger.ms": 5})
    acked = []

    def delivered(err, msg):
        if err is not None:
            raise SystemExit(f"delivery failed: {err}")
        acked.append(msg.offset())

    for i in range(args.start, args.start + args.count):
        key = key_ser(f"order-{i}", key_ctx)
        value = value_ser(order(i, args.schema_version), value_ctx)
        while True:
            try:
                producer.produce(args.topic, key=key, value=value,
                                 partition=i % args.partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)
    if len(acked) != args.count:
        raise SystemExit(f"{len(acked)} of {args.count} acknowledged")
    print(len(acked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
