"""Prints the rows of the committed Parquet part files of a file sink's directory.

The independent reader of the Parquet tests: pyarrow (Arrow's C++ implementation),
not lockgate's writer. Reads every file named part-*.parquet under the directory given
(hidden and underscore-prefixed files and folders are staging, as Spark and Hive
treat them) and prints one JSON object per row: {"file": name, "row": {...}}, with
decimals as their exact text, timestamps as ISO 8601, binary as hex.

With --schema it prints the schema of each file instead: {"file": name, "schema": ...}.
"""

import datetime
import decimal
import json
import os
import sys

import pyarrow.parquet as pq


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


def parts(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(files):
            if name.startswith("part-") and name.endswith(".parquet"):
                yield os.path.join(folder, name)


def main():
    args = sys.argv[1:]
    schema = "--schema" in args
    root = [a for a in args if a != "--schema"][0]
    if not os.path.isdir(root):
        return
    for path in parts(root):
        name = os.path.relpath(path, root)
        f = pq.ParquetFile(path)
        if schema:
            fields = [
                {"name": fld.name, "type": str(fld.type), "nullable": fld.nullable}
                for fld in f.schema_arrow
            ]
            codec = f.metadata.row_group(0).column(0).compression if f.metadata.num_row_groups else None
            print(json.dumps({"file": name, "schema": fields, "compression": codec}))
            continue
        for row in f.read().to_pylist():
            print(json.dumps({"file": name, "row": plain(row)}))


main()
