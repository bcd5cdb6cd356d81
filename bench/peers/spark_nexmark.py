"""Spark Structured Streaming peer for bench/nexmark: the Nexmark queries Spark can run over a
stream, on the same JSON topics statetable and Flink read.

Each query runs Nexmark's own SELECT through `spark.sql` over streaming views `bid`, `auction` and
`person` (Kafka sources, `from_json`), with Spark's RocksDB state store and changelog
checkpointing, trigger `availableNow` (the query stops once it has read what the topics held at
start), and a Kafka sink: `update` mode for aggregates (the last value per key is the answer, as
Flink's upsert-kafka), `append` for joins. Where Spark refuses Nexmark's text, the query is tried
anyway and Spark's own error is the result (`refused`), so the report says why Spark is not
compared there; two queries have an idiomatic Spark form that keeps Nexmark's answer (REWRITES).

Runs in statetable's venv (the same pyspark 4.2.0) and uses none of statetable's code beyond the
session's jar list. One query a process, as the Flink peer: its JVM start and peak RSS are its
own. Writes <out>/result.json, naming the sink topic, which bench/nexmark reads back.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pyspark
from confluent_kafka.admin import AdminClient, NewTopic

from spark_jobs.engine import session

STATE_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
}
SCHEMAS = {
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, dateTime TIMESTAMP, extra STRING",
    "auction": "id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, "
               "dateTime TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra STRING",
    "person": "id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING, "
              "dateTime TIMESTAMP, extra STRING",
}
RANKS = (("rank1", "price < 10000"), ("rank2", "price >= 10000 and price < 1000000"), ("rank3", "price >= 1000000"))
COUNTS = "count(*) AS total_bids, " + ", ".join(f"count(*) filter (where {w}) AS {r}_bids" for r, w in RANKS)
DISTINCTS = "".join(f", count(distinct {c}) AS total_{c}s" + "".join(
    f", count(distinct {c}) filter (where {w}) AS {r}_{c}s" for r, w in RANKS) for c in ("bidder", "auction"))
DAY = "DATE_FORMAT(dateTime, 'yyyy-MM-dd')"
# (output mode, key columns (none: every row is an answer), Nexmark's SELECT in Spark SQL's quoting)
QUERIES = {
    "q3": ("append", ("id",), "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P "
                              "on A.seller = P.id WHERE A.category = 10 and (P.state = 'OR' OR P.state = 'ID' "
                              "OR P.state = 'CA')"),
    "q4": ("update", ("category",),
           "SELECT Q.category, AVG(Q.final) AS avg_final FROM (SELECT MAX(B.price) AS final, A.category FROM "
           "auction A, bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires "
           "GROUP BY A.id, A.category) Q GROUP BY Q.category"),
    "q9": ("update", ("id",),
           "SELECT id, auction, bidder, price, bid_dateTime FROM (SELECT A.*, B.auction, B.bidder, B.price, "
           "B.dateTime AS bid_dateTime, ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.dateTime ASC) "
           "AS rownum FROM auction A, bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires) "
           "WHERE rownum <= 1"),
    "q15": ("update", ("day",), f"SELECT {DAY} as day, {COUNTS}{DISTINCTS} FROM bid GROUP BY {DAY}"),
    "q16": ("update", ("channel", "day"),
            f"SELECT channel, {DAY} as day, max(DATE_FORMAT(dateTime, 'HH:mm')) as minute, {COUNTS}{DISTINCTS} "
            f"FROM bid GROUP BY channel, {DAY}"),
    "q17": ("update", ("auction", "day"),
            f"SELECT auction, {DAY} as day, {COUNTS}, min(price) AS min_price, max(price) AS max_price, "
            f"avg(price) AS avg_price, sum(price) AS sum_price FROM bid GROUP BY auction, {DAY}"),
    "q18": ("update", ("bidder", "auction"),
            "SELECT auction, bidder, price, channel, url, dateTime, extra FROM (SELECT *, ROW_NUMBER() OVER "
            "(PARTITION BY bidder, auction ORDER BY dateTime DESC) AS rank_number FROM bid) WHERE rank_number <= 1"),
    "q19": ("update", ("auction", "rank_number"),
            "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number "
            "FROM bid) WHERE rank_number <= 10"),
    "q20": ("append", (),
            "SELECT auction, bidder, price, channel, url, B.dateTime AS dateTime, B.extra AS bid_extra, itemName, "
            "description, initialBid, reserve, A.dateTime AS auction_dateTime, expires, seller, category, "
            "A.extra AS auction_extra FROM bid AS B INNER JOIN auction AS A on B.auction = A.id "
            "WHERE A.category = 10"),
}
# Spark's idiomatic form where it refuses Nexmark's text but has one that keeps the answer:
# q11's SESSION group window is session_window (whose end is the last bid plus the gap, as
# Flink's SESSION_END), in `complete` mode: Spark refuses `update` for session windows, and
# `append` would withhold every session the watermark has not passed, as Spark gives a stream no
# end-of-input watermark; q12's TUMBLE window TVF (over the bid's time: see bench/nexmark) is
# window(); q18's ROW_NUMBER top 1 by time is the row with the greatest time, max_by.
REWRITES = {
    "q11": ("complete", ("bidder", "starttime"),
            "SELECT bidder, count(*) AS bid_count, session_window.start AS starttime, session_window.end AS endtime "
            "FROM bid GROUP BY bidder, session_window(dateTime, '10 seconds')"),
    "q12": ("update", ("bidder", "starttime"),
            "SELECT bidder, count(*) AS bid_count, window.start AS starttime, window.end AS endtime "
            "FROM bid GROUP BY bidder, window(dateTime, '10 seconds')"),
    "q18": ("update", ("bidder", "auction"),
            "SELECT bidder, auction, last.price, last.channel, last.url, last.dateTime, last.extra FROM "
            "(SELECT bidder, auction, max_by(struct(price, channel, url, dateTime, extra), dateTime) AS last "
            "FROM bid GROUP BY bidder, auction)"),
}
# Flink's window table functions (TUMBLE/HOP over TABLE ...), which Spark SQL has no form of; in
# Spark these are window()/session_window() aggregates chained into joins and other aggregates.
NOT_TRIED = {"q5": "HOP window TVF, then an aggregate joined to an aggregate of it",
             "q7": "TUMBLE window TVF joined back to the stream",
             "q8": "two TUMBLE window TVF aggregates joined"}
ALL = (*QUERIES, *REWRITES)
# The queries whose state is kept by event time, and so the only ones given Nexmark's watermark:
# elsewhere Spark would only track it. (q4's chain of aggregates over a join is refused with or
# without one, for the rows a downstream operator could drop as late.)
EVENT_TIME = ("q11",)


def spec(query: str) -> tuple[str, tuple[str, ...], str, bool]:
    """(output mode, keys, SELECT, whether it is Spark's rewrite rather than Nexmark's text)."""
    if query in REWRITES:
        return (*REWRITES[query], True)
    return (*QUERIES[query], False)


def run(query: str, args) -> dict:
    spark = session.get_or_create(f"bench-spark-nexmark-{query}", local=True)
    for key, value in STATE_CONF.items():
        spark.conf.set(key, value)
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    for name, schema in SCHEMAS.items():
        raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
               .option("subscribe", f"{args.prefix}{name}").option("startingOffsets", "earliest").load())
        events = raw.select(F.from_json(F.col("value").cast("string"), schema).alias("e")).select("e.*")
        if query in EVENT_TIME:
            events = events.withWatermark("dateTime", "4 seconds")      # Nexmark's
        events.createOrReplaceTempView(name)
    mode, keys, select, rewritten = spec(query)
    topic = f"{args.prefix}spark-{query}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})     # held: its futures die with it
    admin.create_topics([NewTopic(topic, 4, 1, config={"cleanup.policy": "compact" if keys else "delete"})])[topic].result()
    try:
        frame = spark.sql(select)
        out = frame.select(
            (F.to_json(F.struct(*keys)) if keys else F.lit(None).cast("string")).alias("key"),
            F.to_json(F.struct(*frame.columns)).alias("value"))
        started = time.perf_counter()
        stream = (out.writeStream.outputMode(mode).format("kafka")
                  .option("kafka.bootstrap.servers", args.bootstrap).option("topic", topic)
                  .option("checkpointLocation", str(Path(args.out) / "checkpoint"))
                  .trigger(availableNow=True).start())
        stream.awaitTermination()
        seconds = time.perf_counter() - started
    except PySparkException as exc:       # Spark's own word on Nexmark's text
        return {"refused": str(exc).strip().splitlines()[0][:300], "rewritten": rewritten}
    if stream.exception():
        raise SystemExit(f"{query} failed: {stream.exception()}")
    spark.stop()
    return {"seconds": round(seconds, 3), "rewritten": rewritten, "mode": mode, "select": select,
            "batches": len(stream.recentProgress),
            "input_rows": sum(p["numInputRows"] for p in stream.recentProgress),
            "topic": topic, "keyed": bool(keys)}


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--prefix", "--out", "--query"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    done = run(args.query, args)
    print(f"spark {args.query}: {json.dumps(done)}", flush=True)
    Path(args.out, "result.json").write_text(json.dumps(
        {"system": "Spark Structured Streaming (RocksDB state store)", "version": pyspark.__version__,
         "processing_seconds": done.get("seconds"), "query": done}))


if __name__ == "__main__":
    main()
