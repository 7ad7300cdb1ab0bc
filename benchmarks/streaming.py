"""Streaming latency: a steady rate source into the table, xasink's two stream writers beside Spark's JDBC writer.

Spark's ``rate`` source produces ``--rates`` rows per second (2 partitions, Spark ``local[2]``); each row carries its
generation time (the source's ``timestamp``, kept as ``gen_ms``, epoch milliseconds).  A processing-time trigger
(``--trigger``, default 1 s) hands each micro-batch to one of three writers, one query at a time:

- ``xasink-stream``: ``writeStream.format("xasink")`` (url, dbtable, sinkId, checkpointLocation);
- ``xasink-foreach``: ``writeStream.foreachBatch(xasink.foreach_batch(url=, table=, sink_id=))``;
- ``jdbc-foreach``: Spark's tuned JDBC writer inside ``foreachBatch`` (at-least-once).

Per (database, rate, writer) a fresh table, checkpoint and sink id; the first ``--warmup`` seconds are not counted,
then a ``--duration`` window.  Figures: the batch duration (``triggerExecution`` of the query's progress events)
p50/p99, and the latency from a row's generation to its visibility: a poller thread reads, every ~50 ms in its own
autocommit connection, the sampled rows it has not seen yet together with the server's statement time; the first
poll that sees a row bounds its visibility from above.  Rows generated in the window but never seen before the
drain limit count with their latency at the stop (a lower bound) and mark the step as behind.
A writer has fallen behind at a rate when more than half of the window's batches take longer than the trigger
interval, its latency grows by more than one trigger interval from the window's first third to its last (a backlog
building up), or the window's rows are not all visible within ``--drain`` seconds of its end (with
``--stop-behind`` it is then not tried at higher rates).  The highest rate with every step up to it kept up is its
sustained rate.

    python -m benchmarks.streaming                                  # 1k, 5k, 20k, 50k rows/s; both databases
    python -m benchmarks.streaming --quick                          # harness check: 2k rows/s (4.4 min at load 15)
    python -m benchmarks.streaming --rates 5000 --db mariadb --contenders xasink-stream --name st-check
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import cli, report
from benchmarks import env as benv
from benchmarks.contenders import jdbc_write

log = logging.getLogger("benchmarks.streaming")

PARTITIONS = 2
CONTENDERS = ("xasink-stream", "xasink-foreach", "jdbc-foreach")
SAMPLED_PER_SECOND = 500  # the poller reads about this many rows a second (every S-th id, S odd: both partitions)
POLL_S = 0.05
FIRST_BATCH_S = 60.0  # the longest wait for a query's first batch with rows
COLUMNS = (  # name, PostgreSQL type, MariaDB type, Spark SQL over the rate source's (timestamp, value)
    ("id", "bigint", "BIGINT", "value"),  # the primary key
    ("gen_ms", "bigint NOT NULL", "BIGINT NOT NULL", "unix_millis(timestamp)"),
    ("grp", "integer", "INT", "cast(value % 1000 as int)"),
    ("amount", "double precision", "DOUBLE", "cast(value as double) * 0.5"),
    ("label", "text", "VARCHAR(32)", "concat('L', cast(value % 100000 as string))"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.parser("benchmarks.streaming", __doc__, "stream-<time> / stream-quick-<time>")
    p.add_argument("--rates", default="1000,5000,20000,50000", help="rows/s steps (default 1000,5000,20000,50000)")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds not counted at the start of each step")
    p.add_argument("--duration", type=float, default=30.0, help="measured seconds per step (default 30)")
    p.add_argument("--drain", type=float, default=15.0, help="seconds after the window for its rows to be visible")
    p.add_argument("--trigger", type=float, default=1.0, help="processing-time trigger interval, seconds")
    p.add_argument("--stop-behind", action="store_true", help="skip a writer's higher rates once it falls behind")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help=",".join(CONTENDERS))
    p.add_argument(
        "--quick", action="store_true", help="harness check: 2000 rows/s, 3 s warm-up, 8 s window (under 3 minutes)"
    )
    p.add_argument("--report", metavar="JSON", help="only write the markdown and chart again from a results file")
    args = cli.parse(p, argv)
    if args.quick:
        args.rates, args.warmup, args.duration, args.drain = "2000", 3.0, 8.0, 6.0
    args.name = args.name or time.strftime("stream-quick-%Y%m%d-%H%M%S" if args.quick else "stream-%Y%m%d-%H%M%S")
    args.contender_list = cli.split(args.contenders)
    for bad in set(args.contender_list) - set(CONTENDERS):
        p.error(f"unknown contender {bad!r}: choose from {CONTENDERS}")
    return args


def sample_stride(rate: int) -> int:
    s = max(1, rate // SAMPLED_PER_SECOND)
    return s if s % 2 else s + 1  # the rate source deals ids round-robin to the partitions: an odd stride hits both


class Sampler(benv.Poller):
    """Records, for every S-th id, the server time of the first poll that sees it (its visibility's upper bound)."""

    def __init__(self, db: benv.Database, table: str, stride: int) -> None:
        super().__init__(db, table, POLL_S)
        self.stride = stride
        self.seen: dict[int, tuple[int, float]] = {}  # id -> (gen_ms, visible_ms)
        self.watermark = -stride  # every sampled id up to it has been seen
        self.polls: list[float] = []  # wall seconds between polls (the resolution)
        self.last = time.monotonic()
        now = (
            "CAST(extract(epoch FROM statement_timestamp()) * 1000 AS double precision)"
            if db.kind == "postgresql"
            else "UNIX_TIMESTAMP(NOW(6)) * 1000"
        )
        self.statement = f"SELECT id, gen_ms, {now} FROM {db.quote(table)} WHERE id > %s AND mod(id, {stride}) = 0"

    def poll(self, cur: Any) -> None:
        cur.execute(self.statement, (self.watermark,))
        for ident, gen_ms, now_ms in cur.fetchall():
            if ident not in self.seen:
                self.seen[int(ident)] = (int(gen_ms), float(now_ms))
        while self.watermark + self.stride in self.seen:
            self.watermark += self.stride
        t = time.monotonic()
        self.polls.append(t - self.last)
        self.last = t

    def gen_of_watermark(self) -> int | None:
        got = self.seen.get(self.watermark)
        return got[0] if got else None


def progress_events(query: Any) -> list[dict[str, Any]]:
    out = []
    for p in query.recentProgress:
        out.append(json.loads(p.json) if hasattr(p, "json") else dict(p))
    return out


def event_ms(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp() * 1000


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def prepared_of(db: benv.Database, sink: str, settle_s: float = 10.0) -> int:
    """This step's prepared branches still there ``settle_s`` after the stop (a batch stopped mid-way is rolled back
    by its abort)."""
    deadline = time.monotonic() + settle_s
    while (left := db.prepared(sink)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def start_query(
    spark: Any, name: str, db: benv.Database, rate: int, table: str, sink: str, ck: str, trigger: float
) -> Any:
    df = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", str(rate))
        .option("numPartitions", str(PARTITIONS))
        .load()
        .selectExpr(*[f"{expr} as {n}" for n, _, _, expr in COLUMNS])
    )
    writer = df.writeStream.queryName(f"{sink}").option("checkpointLocation", ck)
    writer = writer.trigger(processingTime=f"{int(trigger * 1000)} milliseconds")
    if name == "xasink-stream":
        writer = writer.format("xasink").option("url", db.xasink_url).option("dbtable", table).option("sinkId", sink)
    elif name == "xasink-foreach":
        import xasink

        writer = writer.foreachBatch(xasink.foreach_batch(url=db.xasink_url, table=table, sink_id=sink))
    else:

        def jdbc_batch(batch: Any, _batch_id: int) -> None:
            jdbc_write(batch, db, tuned=True, table=table)

        writer = writer.foreachBatch(jdbc_batch)
    return writer.start()


def stop_query(query: Any, limit: float = 30.0) -> None:
    """Stop between batches when one comes within ``limit`` s (a stop mid-batch is safe, but wastes the batch)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and query.isActive and query.status.get("isTriggerActive"):
        time.sleep(0.02)
    query.stop()


def run_step(spark: Any, db: benv.Database, name: str, rate: int, args: argparse.Namespace, work: Path) -> dict:
    short = {"xasink-stream": "xs", "xasink-foreach": "xf", "jdbc-foreach": "jf"}[name]
    table = f"st_{short}_{rate}"
    sink = f"b-st-{db.kind[:2]}-{short}-{rate}-{int(time.time()) % 100000}"
    ck = str(work / f"ck-{db.kind}-{short}-{rate}")
    db.create_table(table, [(n, pg, my) for n, pg, my, _ in COLUMNS])
    stride = sample_stride(rate)
    poller = Sampler(db, table, stride)
    poller.start()
    w0 = w1 = time.time() * 1000
    query = start_query(spark, name, db, rate, table, sink, ck, args.trigger)
    error = None
    try:
        first_deadline = time.time() + FIRST_BATCH_S  # the first batch starts Python workers: not part of the window
        while time.time() < first_deadline and not any(e.get("numInputRows", 0) for e in progress_events(query)):
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.2)
        t0_ms = time.time() * 1000
        w0, w1 = t0_ms + args.warmup * 1000, t0_ms + (args.warmup + args.duration) * 1000
        while time.time() * 1000 < w1:
            if query.exception() is not None or poller.error is not None:
                raise RuntimeError(str(query.exception() or poller.error))
            time.sleep(0.2)
        drain_end = time.time() + args.drain
        while time.time() < drain_end:  # until every sampled row generated in the window is visible
            g = poller.gen_of_watermark()
            if g is not None and g >= w1:
                break
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.1)
        drained = (poller.gen_of_watermark() or 0) >= w1
    except Exception as exc:  # noqa: BLE001 - recorded; the next step still runs
        error, drained = str(exc).splitlines()[0][:300], False
        log.error("%s %s %s rows/s: %s", db.kind, name, rate, error)
    stop_ms = time.time() * 1000
    stop_query(query)
    poller.stop()
    events = progress_events(query)
    shutil.rmtree(ck, ignore_errors=True)
    leftover = prepared_of(db, sink)
    if leftover:
        log.error("%s: %d prepared branches left %ds after stopping %s: recovering them", db.kind, leftover, 10, sink)
        from xasink.ops import survey as admin

        done = admin.recover(db.xasink_url, sink_id=sink, older_than_s=0)  # the query is stopped: nothing is live
        log.error("recovery of %s: %s", sink, [(e.gid, e.action, e.outcome) for e in done.entries])

    window = [e for e in events if w0 <= event_ms(e) <= w1 and e.get("numInputRows", 0) > 0]
    durations = [float(e["durationMs"]["triggerExecution"]) for e in window]
    trigger_ms = args.trigger * 1000
    over = sum(1 for d in durations if d > trigger_ms)
    # the rate source's timestamps are linear in the id: gen(v) = start + v * 1000 / rate
    latencies, censored = [], 0
    any_seen = next(iter(poller.seen.items()), None)
    if any_seen is not None:
        start_ms = any_seen[1][0] - any_seen[0] * 1000 / rate
        v_lo = math.ceil((w0 - start_ms) * rate / 1000 / stride) * stride
        v_hi = math.floor((w1 - start_ms) * rate / 1000 / stride) * stride
        for v in range(max(0, v_lo), v_hi + 1, stride):
            got = poller.seen.get(v)
            if got is not None:
                latencies.append(got[1] - got[0])
            else:
                censored += 1
                latencies.append(stop_ms - (start_ms + v * 1000 / rate))
    rows_in = sum(int(e["numInputRows"]) for e in window)
    busy_s = sum(durations) / 1000
    # behind: most batches outlast the trigger, or the latency grows across the window (a backlog building up)
    third = len(latencies) // 3
    growth = statistics.fmean(latencies[-third:]) - statistics.fmean(latencies[:third]) if third else 0.0
    behind = bool(error) or not drained or not window or over > 0.5 * len(window) or growth > trigger_ms
    res = {
        "db": db.kind,
        "contender": name,
        "rate": rate,
        "table": table,
        "batches": len(window),
        "batch_ms_p50": pct(durations, 0.5),
        "batch_ms_p99": pct(durations, 0.99),
        "batch_ms_max": max(durations, default=None),
        "batches_over_trigger": over,
        "rows_per_batch_p50": pct([float(e["numInputRows"]) for e in window], 0.5),
        "input_rows_per_s": round(rows_in / args.duration, 1),
        "capacity_rows_per_s": round(rows_in / busy_s, 1) if busy_s else None,  # rows over time spent in batches
        "latency_ms_p50": rounded(pct(latencies, 0.5)),
        "latency_ms_p99": rounded(pct(latencies, 0.99)),
        "latency_samples": len(latencies),
        "latency_censored": censored,
        "latency_growth_ms": round(growth, 1),
        "sample_stride": stride,
        "poll_ms_p50": round(1000 * (pct(poller.polls, 0.5) or 0), 1),
        "drained": drained,
        "behind": behind,
        "error": error,
        "leftover_prepared": leftover,
        "rows_in_table": db.count(table),
        "progress": [
            {
                "batchId": e["batchId"],
                "timestamp": e["timestamp"],
                "rows": e["numInputRows"],
                "durationMs": e["durationMs"],
            }
            for e in events
        ],
    }
    db.drop(table)
    return res


def run_db(
    spark: Any, db: benv.Database, rates: list[int], names: list[str], args: argparse.Namespace, bar: Any
) -> list[dict]:
    out: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="xasink-stream-bench-"))
    behind: set[str] = set()
    if not db.xasink_ok:
        behind |= {"xasink-stream", "xasink-foreach"}
    for rate in rates:
        for k, name in enumerate(names if rates.index(rate) % 2 == 0 else list(reversed(names))):
            bar.set_postfix_str(f"{db.kind} {name} {rate}/s")
            if name in behind:
                bar.update(1)
                continue
            r = run_step(spark, db, name, rate, args, work)
            out.append(r)
            log.info(
                "%s %s %d rows/s: batch p50 %s ms p99 %s ms, latency p50 %s ms p99 %s ms%s",
                db.kind, name, rate, r["batch_ms_p50"], r["batch_ms_p99"], r["latency_ms_p50"],
                r["latency_ms_p99"], " BEHIND" if r["behind"] else "",
            )  # fmt: skip
            if r["behind"] and args.stop_behind:
                behind.add(name)
            bar.update(1)
            del k
    shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.logs()
    from benchmarks.streaming_report import chart, markdown  # it reads this module's constants

    if args.report:
        done: dict[str, Any] = json.loads(Path(args.report).read_text())
        base = Path(args.report).with_suffix("")
        print(report.write(done, base.parent, base.name, markdown, chart).read_text())
        return 0
    rates = cli.ints(args.rates)
    names = args.contender_list
    res: dict[str, Any] = {
        "name": args.name,
        "command": args.command,
        "machine": benv.machine(),
        "trigger_s": args.trigger,
        "warmup_s": args.warmup,
        "duration_s": args.duration,
        "drain_s": args.drain,
        "contenders": names,
        "settings": {},
        "results": [],
    }
    with benv.databases(args.dbs, args.mariadb) as dbs:
        res["settings"] = {db.kind: db.settings for db in dbs}
        spark = benv.spark_session(f"local[{PARTITIONS}]", driver_memory="3g")
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")
        try:
            with cli.progress(len(dbs) * len(rates) * len(names), "streaming", unit="step") as bar:
                for db in dbs:
                    res["results"] += run_db(spark, db, rates, names, args, bar)
        finally:
            spark.stop()
    res["load_average_at_end"] = report.load_average()
    print(report.write(res, args.out, args.name, markdown, chart).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
