"""Prints the rows of the committed Parquet part files of a file sink's directory, or
of its prefix in an object store (s3://bucket/prefix, reached through AWS_ENDPOINT_URL,
AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY). A part without the .parquet
extension is a JSON-lines part: its lines are printed as rows.

The independent reader of the Parquet tests: pyarrow (Arrow's C++ implementation),
not lockgate's writer. Reads every file named part-*.parquet under the directory given
(hidden and underscore-prefixed files and folders are staging, as Spark and Hive
treat them) and prints one JSON object per row: {"file": name, "row": {...}}, with
decimals as their exact text, timestamps as ISO 8601, binary as hex.

With --schema it prints the schema of each file instead: {"file": name, "schema": ...}.
With --hive it reads the directory as one pyarrow dataset with Hive partitioning
(folders name=value, as Spark, Hive and Trino read them) and prints {"row": {...}},
each row with its partition columns.
"""

import datetime
import decimal
import json
import os
import sys

import pyarrow.dataset as pads
import pyarrow.fs as pafs
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


def committed(relative):
    *folders, name = relative.split("/")
    return (
        not any(f.startswith((".", "_")) for f in folders)
        and name.startswith("part-")
        and (name.endswith(".parquet") or "." not in name)
    )


def filesystem(root):
    """The filesystem of root and the path in it."""
    if root.startswith("s3://"):
        from urllib.parse import urlparse

        endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint.netloc,
            scheme=endpoint.scheme,
            region=os.environ.get("AWS_REGION", "us-east-1"),
            access_key=os.environ["AWS_ACCESS_KEY_ID"],
            secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        )
        return fs, root[len("s3://"):].rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(root)


def hive(root):
    fs, base = filesystem(root)
    # Discovery skips files and folders beginning with "." or "_" (staging).
    dataset = pads.dataset(base, format="parquet", partitioning="hive", filesystem=fs)
    for row in dataset.to_table().to_pylist():
        print(json.dumps({"row": plain(row)}))


def parts(root):
    """(filesystem, path, name relative to root) of each committed part, in order."""
    fs, base = filesystem(root)
    if not root.startswith("s3://") and not os.path.isdir(root):
        return
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    found = sorted(i.path for i in infos if i.type == pafs.FileType.File)
    for path in found:
        relative = path[len(base.rstrip("/")) + 1:]
        if committed(relative):
            yield fs, path, relative


def main():
    args = sys.argv[1:]
    schema = "--schema" in args
    root = [a for a in args if not a.startswith("--")][0]
    if "--hive" in args:
        hive(root)
        return
    for fs, path, name in parts(root):
        if not name.endswith(".parquet"):
            # A JSON-lines part (the sink's default format).
            if not schema:
                with fs.open_input_stream(path) as stream:
                    for line in stream.read().decode().splitlines():
                        print(json.dumps({"file": name, "row": json.loads(line)}))
            continue
        f = pq.ParquetFile(fs.open_input_file(path))
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
