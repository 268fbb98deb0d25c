"""Prints an Iceberg table as pyiceberg reads it through a SQL catalog: the independent
reader of the Iceberg sink's tests (pyiceberg's own catalog, metadata and manifest code,
and pyarrow's Parquet reader), not lockgate's.

    read_iceberg.py CATALOG_URI WAREHOUSE NAME NAMESPACE.TABLE

CATALOG_URI is SQLAlchemy's (sqlite:////abs/path.db). An object-store warehouse is
reached through AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY.

Prints one JSON object per line: {"snapshot": {...}} for each snapshot of the table
(id, parent, operation, summary, the data files it added), oldest first, then
{"row": {...}} for each row of the current snapshot, decimals as exact text and times
in ISO 8601. A table that does not exist prints nothing.

With --append URI WAREHOUSE NAME TABLE ROW it appends ROW (a JSON object) to the
table as another writer would, in a snapshot of its own.

With --serve it reads the four arguments as one line of stdin, as many times as
given, and ends each answer with {"end": true}: one process for many reads (pyiceberg
takes a second to import).
"""

import datetime
import decimal
import json
import os
import sys

from pyiceberg.catalog.sql import SqlCatalog


def plain(v):
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def catalog_of(uri, warehouse, name):
    props = {"uri": uri, "warehouse": warehouse}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        props.update({
            "s3.endpoint": endpoint,
            "s3.region": os.environ.get("AWS_REGION", "us-east-1"),
            "s3.access-key-id": os.environ.get("AWS_ACCESS_KEY_ID", ""),
            "s3.secret-access-key": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        })
    return SqlCatalog(name, **props)


def append(uri, warehouse, name, table_name, row):
    import pyarrow as pa
    table = catalog_of(uri, warehouse, name).load_table(table_name)
    schema = table.schema().as_arrow()
    table.append(pa.Table.from_pylist([json.loads(row)], schema=schema))


def read(uri, warehouse, name, table_name):
    catalog = catalog_of(uri, warehouse, name)
    if not catalog.table_exists(table_name):
        return
    table = catalog.load_table(table_name)
    out = sys.stdout
    for s in sorted(table.snapshots(), key=lambda s: s.sequence_number):
        added = []
        for manifest in s.manifests(table.io):
            if manifest.added_snapshot_id != s.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.snapshot_id == s.snapshot_id:
                    added.append(entry.data_file.file_path)
        summary = s.summary
        out.write(json.dumps({"snapshot": {
            "id": s.snapshot_id,
            "parent": s.parent_snapshot_id,
            "operation": summary.operation.value if summary else None,
            "summary": dict(summary.additional_properties) if summary else {},
            "added": added,
        }}) + "\n")
    current = table.current_snapshot()
    out.write(json.dumps({"current": current.snapshot_id if current else None}) + "\n")
    if current is None:
        return
    for batch in table.scan().to_arrow().to_batches():
        for row in batch.to_pylist():
            out.write(json.dumps({"row": plain(row)}) + "\n")


def main():
    if sys.argv[1:2] == ["--append"]:
        append(*sys.argv[2:7])
        return
    if sys.argv[1:] == ["--serve"]:
        for line in sys.stdin:
            try:
                read(*line.split())
            except Exception as e:  # the answer says why, and the process serves on
                sys.stdout.write(json.dumps({"error": repr(e)}) + "\n")
            sys.stdout.write(json.dumps({"end": True}) + "\n")
            sys.stdout.flush()
        return
    read(*sys.argv[1:5])


if __name__ == "__main__":
    main()
