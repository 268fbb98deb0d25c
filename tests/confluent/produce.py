"""Produces records with Confluent's own Schema Registry serializers (confluent-kafka),
so that lockgate's decoders are checked against an independent writer.

    produce.py --bootstrap B --registry URL --topic T --format avro --count N
               [--from I] [--partitions P]
    produce.py --bootstrap B --registry URL --topic T --format avro --changes FILE

Record i is the same in every format (see order() and the schemas below); its key is
"order-<i>", serialized with the same format as the value (a string in Avro and JSON
Schema, the message OrderKey {id} in Protobuf). Prints the
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


def protobuf_classes():
    """Order (with its key, OrderKey) built from descriptors, as protoc would generate
    it: Address in a file of its own (a schema reference the serializer registers),
    the well-known and Confluent types imported (built in, not registered)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.protobuf import timestamp_pb2, wrappers_pb2  # noqa: F401 (registers the files)
    from google.type import date_pb2  # noqa: F401
    from confluent_kafka.schema_registry.confluent.type import decimal_pb2  # noqa: F401

    F = descriptor_pb2.FieldDescriptorProto
    pool = descriptor_pool.Default()
    try:
        return (message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.OrderKey")),
                message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order")))
    except KeyError:
        pass
    address = descriptor_pb2.FileDescriptorProto(name="shop/address.proto", package="shop", syntax="proto3")
    a = address.message_type.add(name="Address")
    a.field.add(name="city", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    a.field.add(name="zip", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    pool.Add(address)
    order = descriptor_pb2.FileDescriptorProto(
        name="shop/order.proto", package="shop", syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto",
                    "google/type/date.proto", "confluent/type/decimal.proto", "shop/address.proto"])
    k = order.message_type.add(name="OrderKey")
    k.field.add(name="id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    o = order.message_type.add(name="Order")
    status = o.enum_type.add(name="Status")
    for n, name in enumerate(["NEW", "PAID", "SHIPPED"]):
        status.value.add(name=name, number=n)
    entry = o.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    fields = [
        ("id", F.TYPE_INT64, None), ("user", F.TYPE_STRING, None),
        ("amount", F.TYPE_MESSAGE, ".confluent.type.Decimal"),
        ("ts", F.TYPE_MESSAGE, ".google.protobuf.Timestamp"),
        ("note", F.TYPE_MESSAGE, ".google.protobuf.StringValue"),
        ("status", F.TYPE_ENUM, ".shop.Order.Status"),
        ("address", F.TYPE_MESSAGE, ".shop.Address"),
        ("tags", F.TYPE_STRING, None),
        ("attrs", F.TYPE_MESSAGE, ".shop.Order.AttrsEntry"),
        ("day", F.TYPE_MESSAGE, ".google.type.Date"),
    ]
    for n, (name, t, type_name) in enumerate(fields, start=1):
        repeated = name in ("tags", "attrs")
        f = o.field.add(name=name, number=n, type=t,
                        label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name
    pool.Add(order)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.OrderKey")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order")))


def protobuf_order(cls, i):
    from confluent_kafka.schema_registry.protobuf import decimal_to_protobuf
    from google.type import date_pb2

    d = order(i)
    m = cls(id=i, user=d["user"], status=i % 3, tags=d["tags"])
    m.amount.CopyFrom(decimal_to_protobuf(d["amount"], 2))
    m.ts.FromMilliseconds(EPOCH_MS + i * 1000)
    if d["note"] is not None:
        m.note.value = d["note"]
    m.address.city = "Lyon"
    m.address.zip = d["address"]["zip"]
    for k, v in d["attrs"].items():
        m.attrs[k] = v
    m.day.CopyFrom(date_pb2.Date(year=d["day"].year, month=d["day"].month, day=d["day"].day))
    return m


JSON_VALUE = """
{"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
 "properties": {
  "id": {"type": "integer"}, "user": {"type": "string"}, "amount": {"type": "number"},
  "ts": {"type": "integer"}, "note": {"type": ["string", "null"]},
  "status": {"enum": ["NEW", "PAID", "SHIPPED"]},
  "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}},
  "tags": {"type": "array", "items": {"type": "string"}},
  "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
  "day": {"type": "string"}},
 "required": ["id", "user", "amount", "ts", "status"]}
"""


def json_order(i):
    d = order(i)
    return d | {
        "amount": float(d["amount"]),
        "ts": EPOCH_MS + i * 1000,
        "day": d["day"].isoformat(),
    }


def serializers(fmt, registry, version):
    if fmt == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        key_cls, value_cls = protobuf_classes()
        key = ProtobufSerializer(key_cls, registry, {"use.deprecated.format": False})
        value = ProtobufSerializer(value_cls, registry, {"use.deprecated.format": False})
        return (lambda k, ctx: key(key_cls(id=k), ctx),
                lambda o, ctx: value(protobuf_order(value_cls, o["id"]), ctx))
    if fmt == "json-schema":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        key = JSONSerializer('{"type": "string"}', registry)
        value = JSONSerializer(JSON_VALUE, registry)
        return key, lambda o, ctx: value(json_order(o["id"]), ctx)
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        schema = AVRO_VALUE if version == 1 else AVRO_VALUE_V2
        value = AvroSerializer(registry, schema, lambda o, ctx: o)
        key = AvroSerializer(registry, '"string"')
        return key, value
    raise SystemExit(f"unknown format {fmt}")


# Debezium's Avro change events of a `products` table (as its Avro converter writes
# them): the envelope, and the key of the primary key.
DEBEZIUM_VALUE = """
{"type": "record", "name": "Envelope", "namespace": "dbserver1.inventory.products",
 "fields": [
  {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": [
     {"name": "id", "type": "long"},
     {"name": "name", "type": "string"},
     {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2,
                                "connect.name": "org.apache.kafka.connect.data.Decimal"}},
     {"name": "note", "type": ["null", "string"], "default": null}]}], "default": null},
  {"name": "after", "type": ["null", "Value"], "default": null},
  {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
     "fields": [{"name": "connector", "type": "string"}, {"name": "table", "type": "string"},
                {"name": "lsn", "type": ["null", "long"], "default": null}, {"name": "ts_ms", "type": "long"}]}},
  {"name": "op", "type": "string"},
  {"name": "ts_ms", "type": ["null", "long"], "default": null}
 ]}
"""

DEBEZIUM_KEY = """
{"type": "record", "name": "Key", "namespace": "dbserver1.inventory.products",
 "fields": [{"name": "id", "type": "long"}]}
"""


def produce_changes(args, registry):
    """Produces the change events of --changes (one JSON object per line: partition,
    key, value; a null value is Debezium's tombstone), prices as decimals."""
    import json

    from confluent_kafka.schema_registry.avro import AvroSerializer

    def row(r):
        if r is None:
            return None
        return dict(r, price=decimal.Decimal(r["price"]))

    value_ser = AvroSerializer(registry, DEBEZIUM_VALUE,
                               lambda e, ctx: dict(e, before=row(e["before"]), after=row(e["after"])))
    key_ser = AvroSerializer(registry, DEBEZIUM_KEY)
    key_ctx = SerializationContext(args.topic, MessageField.KEY)
    value_ctx = SerializationContext(args.topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": args.bootstrap, "acks": "all", "linger.ms": 5})
    acked = []

    def delivered(err, msg):
        if err is not None:
            raise SystemExit(f"delivery failed: {err}")
        acked.append(msg.offset())

    count = 0
    with open(args.changes) as f:
        for line in f:
            c = json.loads(line)
            key = key_ser(c["key"], key_ctx)
            value = None if c["value"] is None else value_ser(c["value"], value_ctx)
            while True:
                try:
                    producer.produce(args.topic, key=key, value=value,
                                     partition=c["partition"], on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            count += 1
    producer.flush(60)
    if len(acked) != count:
        raise SystemExit(f"{len(acked)} of {count} acknowledged")
    print(count)
    return 0


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--bootstrap", required=True)
    a.add_argument("--registry", required=True)
    a.add_argument("--topic", required=True)
    a.add_argument("--format", required=True)
    a.add_argument("--count", type=int)
    a.add_argument("--changes", help="produce these Debezium change events (format avro)")
    a.add_argument("--from", dest="start", type=int, default=0)
    a.add_argument("--partitions", type=int, default=1)
    a.add_argument("--schema-version", type=int, default=1)
    a.add_argument("--out", help="write hex key and value per line here instead of producing")
    a.add_argument("--register-only", action="store_true",
                   help="register the key schema, then version 1 and 2 of the value schema")
    args = a.parse_args()

    registry = SchemaRegistryClient({"url": args.registry})
    if args.changes:
        return produce_changes(args, registry)
    if args.count is None:
        raise SystemExit("--count is required")
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
