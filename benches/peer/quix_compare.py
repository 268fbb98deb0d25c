"""lockgate against Quix Streams on the demo's job (Kafka -> rolling sum by user ->
Elasticsearch upsert), on the embedded servers, one after the other. Run it through
quix_compare.sh, which builds the virtual environment this needs.

For each count of orders: fresh servers (`lockgate testkit kafka`, `lockgate testkit
es`) on free loopback ports; the orders topic read back and summed per user, exactly
(decimals); the job run under `/usr/bin/time -v` (wall time, peak RSS); every user's
document checked against its total. First lockgate's `examples/jobs/orders-to-es.toml`,
then quix_job.py on servers of its own. Prints a table and one JSON line.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from decimal import Decimal
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
JOB = REPO / "examples" / "jobs" / "orders-to-es.toml"
QUIX_JOB = HERE / "quix_job.py"
INDEX = "user-totals"
PARTITIONS = 4
# The topics Quix derives from its job (consumer group `orders-to-es-quix`, one state
# store), by quix_job.py's `--key`. The embedded Kafka cannot create topics on request
# (no admin API), so they are created at start, with the input topic's partitions.
QUIX_TOPICS = {
    "message": ["changelog__orders-to-es-quix--orders--default"],
    "group-by": [
        "repartition__orders-to-es-quix--orders--user",
        "changelog__orders-to-es-quix--repartition.orders.user--default",
    ],
}


def lockgate_bin():
    if os.environ.get("LOCKGATE_BIN"):
        return os.environ["LOCKGATE_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    return str(Path(target) / "release" / "lockgate")


class Servers:
    """The embedded Kafka (with `orders` holding `orders` sample orders, and `extra`
    topics) and the Elasticsearch test server, each on a free loopback port."""

    def __init__(self, work, orders, extra=()):
        self.procs = []
        topics = [f"orders:{PARTITIONS}"] + [f"{t}:{PARTITIONS}" for t in extra]
        args = [lockgate_bin(), "testkit", "kafka", "--port", "0"]
        for t in topics:
            args += ["--topic", t]
        args += ["--orders", f"orders:{orders}"]
        self.kafka = self._start(args, work / "kafka.log")
        self.es = self._start(
            [lockgate_bin(), "testkit", "es", "--listen", "127.0.0.1:0"], work / "es.log"
        )

    def _start(self, args, log):
        p = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(log, "w"),
            text=True,
        )
        self.procs.append(p)
        line = p.stdout.readline().strip()
        if not line:
            self.stop()
            sys.exit(f"error: {args[1]} {args[2]} did not start (see {log})")
        return line

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()


def read_totals(bootstrap):
    """Every user's total over what `orders` holds, read back from the topic (no
    consumer group: partitions assigned from their start to their end offsets)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "peer-compare-reader",
            "enable.auto.commit": False,
        }
    )
    ends = {}
    for p in range(PARTITIONS):
        low, high = c.get_watermark_offsets(TopicPartition("orders", p), timeout=30)
        if high > low:
            ends[p] = (low, high)
    c.assign([TopicPartition("orders", p, low) for p, (low, _) in ends.items()])
    totals, records = {}, 0
    remaining = set(ends)
    while remaining:
        for m in c.consume(10000, timeout=5):
            if m.error():
                sys.exit(f"error: reading orders: {m.error()}")
            v = json.loads(m.value(), parse_float=Decimal, parse_int=Decimal)
            totals[v["user"]] = totals.get(v["user"], Decimal(0)) + v["amount"]
            records += 1
            if m.offset() + 1 >= ends[m.partition()][1]:
                remaining.discard(m.partition())
    c.close()
    return totals, records


def es_request(url, method="GET", body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read(), parse_float=Decimal, parse_int=Decimal)


def check(es, expected):
    """None when the index holds exactly one document per user, each with the exact
    total; otherwise what differs (the first few)."""
    try:
        count = es_request(f"{es}/{INDEX}/_count")["count"]
    except Exception as e:  # noqa: BLE001: any failure means not exact
        return f"cannot count {INDEX}: {e}"
    wrong = []
    if count != len(expected):
        wrong.append(f"{count} documents for {len(expected)} users")
    users = sorted(expected)
    for i in range(0, len(users), 500):
        ids = users[i : i + 500]
        docs = es_request(f"{es}/{INDEX}/_mget", "POST", {"ids": ids})["docs"]
        for user, d in zip(ids, docs):
            got = d.get("_source", {}).get("total") if d.get("found") else None
            if got is None or Decimal(got) != expected[user]:
                wrong.append(f"{user}: {got} (expected {expected[user]})")
    if not wrong:
        return None
    more = f" (+{len(wrong) - 5} more)" if len(wrong) > 5 else ""
    return "; ".join(wrong[:5]) + more


def timed(args, env, log, timeout):
    """Runs `args` under `/usr/bin/time -v`; returns (exit code, wall seconds, peak RSS
    in MiB), or None when it has not ended after `timeout` seconds (then it is killed)."""
    with open(log, "w") as out:
        p = subprocess.Popen(
            ["/usr/bin/time", "-v"] + args,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return None
    text = Path(log).read_text(errors="replace")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if not wall or not rss:
        sys.exit(f"error: no figures from /usr/bin/time in {log}")
    secs = 0.0
    for part in wall.group(1).split(":"):
        secs = secs * 60 + float(part)
    return rc, secs, int(rss.group(1)) / 1024


def measured(timing, es, expected, log, timeout):
    if timing is None:
        print(f"  not exact: still running after {timeout} s, killed (log: {log})", file=sys.stderr)
        return {"seconds": None, "peak_rss_mib": None, "exact": False}
    rc, secs, rss = timing
    wrong = check(es, expected) if rc == 0 else f"exit status {rc}"
    if wrong:
        print(f"  not exact: {wrong} (log: {log})", file=sys.stderr)
    return {"seconds": round(secs, 2), "peak_rss_mib": round(rss, 1), "exact": wrong is None}


def run_lockgate(work, orders, timeout):
    work.mkdir(parents=True)
    servers = Servers(work, orders)
    try:
        expected, records = read_totals(servers.kafka)
        env = dict(
            os.environ,
            LOCKGATE_KAFKA=servers.kafka,
            LOCKGATE_ES=servers.es,
            LOCKGATE_DATA=str(work / "data"),
        )
        log = work / "job.log"
        timing = timed([lockgate_bin(), "run", "--config", str(JOB)], env, log, timeout)
        return dict(records=records, **measured(timing, servers.es, expected, log, timeout))
    finally:
        servers.stop()


def run_quix(work, orders, python, how, timeout):
    guarantee, key = how
    work.mkdir(parents=True)
    servers = Servers(work, orders, QUIX_TOPICS[key])
    try:
        expected, records = read_totals(servers.kafka)
        args = [
            python,
            str(QUIX_JOB),
            "--kafka",
            servers.kafka,
            "--es",
            servers.es,
            "--state-dir",
            str(work / "state"),
            "--guarantee",
            guarantee,
            "--key",
            key,
        ]
        log = work / "job.log"
        timing = timed(args, dict(os.environ), log, timeout)
        return dict(records=records, **measured(timing, servers.es, expected, log, timeout))
    finally:
        servers.stop()


def ratio(a, b):
    return None if a is None or b is None else round(a / b, 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("orders", nargs="*", type=int, default=[200000, 1000000])
    ap.add_argument("--python", default=sys.executable, help="the venv's Python, for Quix")
    ap.add_argument(
        "--quix-guarantee",
        default="exactly-once",
        choices=["exactly-once", "at-least-once"],
    )
    ap.add_argument(
        "--quix-key",
        default="message",
        choices=["message", "group-by"],
        help="how the Quix job keys its state (quix_job.py --key): by the message key, "
        "which is the user, or by group_by through a repartition topic, which the "
        "embedded Kafka keeps only about 5 MiB of per partition (records are lost "
        "beyond about 200,000 orders)",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=900,
        help="seconds each job may run before it is killed and counted as not exact",
    )
    args = ap.parse_args()
    if not Path(lockgate_bin()).is_file():
        sys.exit(
            f"error: no lockgate binary at {lockgate_bin()}: "
            "run `cargo build --release` first (or set LOCKGATE_BIN)"
        )
    from importlib.metadata import version

    quix_version = version("quixstreams")
    work_dir = os.environ.get("PEER_WORK_DIR")
    root = Path(tempfile.mkdtemp(prefix="quix-compare-", dir=work_dir))
    rows = []
    for n in args.orders:
        print(f"{n} orders: lockgate ...", file=sys.stderr)
        lg = run_lockgate(root / f"{n}-lockgate", n, args.timeout)
        print(f"  {lg}", file=sys.stderr)
        print(f"{n} orders: Quix Streams {quix_version} ...", file=sys.stderr)
        qx = run_quix(
            root / f"{n}-quix",
            n,
            args.python,
            (args.quix_guarantee, args.quix_key),
            args.timeout,
        )
        print(f"  {qx}", file=sys.stderr)
        rows.append(
            {
                "orders": n,
                "lockgate": lg,
                "quix": qx,
                "time_ratio_quix_over_lockgate": ratio(qx["seconds"], lg["seconds"]),
                "rss_ratio_lockgate_over_quix": ratio(
                    lg["peak_rss_mib"], qx["peak_rss_mib"]
                ),
            }
        )
    print()
    print(
        f"Kafka -> rolling sum by user -> Elasticsearch upsert; lockgate {JOB.name} "
        f"(exactly-once) against Quix Streams {quix_version} ({args.quix_guarantee}, "
        f"state by {'message key' if args.quix_key == 'message' else 'group_by'})"
    )
    print("| orders | lockgate s | lockgate MiB | exact | Quix s | Quix MiB | exact | Quix/lockgate time | lockgate/Quix RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    def cell(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        lg, qx = r["lockgate"], r["quix"]
        yn = lambda b: "yes" if b else "NO"  # noqa: E731
        print(
            f"| {r['orders']:,} | {cell(lg['seconds'], '.2f')} | {cell(lg['peak_rss_mib'], '.0f')} | {yn(lg['exact'])} "
            f"| {cell(qx['seconds'], '.2f')} | {cell(qx['peak_rss_mib'], '.0f')} | {yn(qx['exact'])} "
            f"| {cell(r['time_ratio_quix_over_lockgate'], '.2f')} | {cell(r['rss_ratio_lockgate_over_quix'], '.2f')} |"
        )
    print(
        json.dumps(
            {
                "peer": "quixstreams",
                "quix_version": quix_version,
                "quix_processing_guarantee": args.quix_guarantee,
                "quix_key": args.quix_key,
                "lockgate_job": f"examples/jobs/{JOB.name}",
                "runs": rows,
            }
        )
    )
    if not all(r["lockgate"]["exact"] and r["quix"]["exact"] for r in rows):
        sys.exit(f"not exact: the logs are kept in {root}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
