"""The Nexmark queries statetable's SQL expresses today, run over the generator's events in Kafka
and checked against pandas over the same events read back: the first step of issue #69, before
the windowed stream-stream joins the rest need and before the peers run beside it.

    .venv/bin/python -m bench.nexmark.statetable_queries [--events 500000] [--port 29792]

It starts a broker of its own and a local Spark session, produces the events (bench/nexmark/
generator.py), runs each query's table until caught up (one batch per query unless the events
exceed its max_records_per_batch), and prints JSON: per query the seconds, bid events per second,
rows, and the check against pandas ("ok", or the first differing keys).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.nexmark.generator import Config, produce

BID = ("-- topic: {prefix}bid\n-- schema: auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
       "dateTime TIMESTAMP, extra STRING\n-- partitions: 4\n")
# Each query as a statetable table; the Nexmark query it stands for is named in its comment.
QUERIES = {
    # q3 (local item suggestion): every auction with its seller's name, city and state (a join of
    # two tables: auctions joined with persons by seller).
    "q3": "CREATE TABLE q3 AS SELECT a.id, a.seller, a.category, p.name, p.city, p.state "
          "FROM auction a JOIN person p ON a.seller = p.id;",
    # q15 (bidding statistics per day): counts and distinct bidders and auctions by price rank.
    "q15": BID + "CREATE TABLE q15 AS SELECT SUBSTR(CAST(dateTime AS STRING), 1, 10) AS day, COUNT(*) AS total_bids, "
                 "COUNT(CASE WHEN price < 10000 THEN 1 END) AS rank1_bids, "
                 "COUNT(CASE WHEN price >= 10000 AND price < 1000000 THEN 1 END) AS rank2_bids, "
                 "COUNT(CASE WHEN price >= 1000000 THEN 1 END) AS rank3_bids, "
                 "COUNT(DISTINCT bidder) AS total_bidders, COUNT(DISTINCT auction) AS total_auctions "
                 "FROM bid GROUP BY SUBSTR(CAST(dateTime AS STRING), 1, 10);",
    # q16 (channel statistics per day, here per channel over the run).
    "q16": BID + "CREATE TABLE q16 AS SELECT channel, COUNT(*) AS total_bids, COUNT(DISTINCT bidder) AS total_bidders, "
                 "COUNT(DISTINCT auction) AS total_auctions, COUNT(CASE WHEN price < 10000 THEN 1 END) AS rank1_bids "
                 "FROM bid GROUP BY channel;",
    # q17 (auction statistics): per auction, counts and price statistics.
    "q17": BID + "CREATE TABLE q17 AS SELECT auction, COUNT(*) AS total_bids, "
                 "COUNT(CASE WHEN price < 10000 THEN 1 END) AS rank1_bids, MIN(price) AS min_price, "
                 "MAX(price) AS max_price, SUM(price) AS sum_price FROM bid GROUP BY auction;",
    # q18 (last bid of each bidder on each auction).
    "q18": BID + "CREATE TABLE q18 AS SELECT bidder, auction, LATEST_BY_OFFSET(price) AS price "
                 "FROM bid GROUP BY bidder, auction;",
    # q19 (the 10 highest bids of each auction).
    "q19": BID + "CREATE TABLE q19 AS SELECT auction, TOPK(10, price) AS top FROM bid GROUP BY auction;",
}
SOURCES = {
    "auction": "CREATE TABLE auction (id BIGINT PRIMARY KEY, itemName STRING, initialBid BIGINT, reserve BIGINT, "
               "dateTime TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT) WITH (topic='{prefix}auction');",
    "person": "CREATE TABLE person (id BIGINT PRIMARY KEY, name STRING, city STRING, state STRING, dateTime TIMESTAMP) "
              "WITH (topic='{prefix}person');",
}


def _frames(bootstrap: str, topics: dict) -> dict:
    """Each kind's events as pandas, in partition and offset order (read back, not regenerated)."""
    import pandas as pd

    from tests.table_env import read_topic

    out = {}
    for kind, topic in topics.items():
        records = sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset()))
        out[kind] = pd.DataFrame([json.loads(m.value()) for m in records])
    return out


def expected(frames: dict) -> dict:
    """Each query's answer by pandas: {query: {key tuple: value tuple}}."""
    bid, auction, person = frames["bid"], frames["auction"], frames["person"]
    bid = bid.assign(day=bid["dateTime"].str[:10], cheap=bid["price"] < 10000,
                     mid=(bid["price"] >= 10000) & (bid["price"] < 1_000_000), dear=bid["price"] >= 1_000_000)
    out = {}
    joined = auction.merge(person, left_on="seller", right_on="id", suffixes=("", "_p"))
    out["q3"] = {(r.id,): (r.seller, r.category, r.name, r.city, r.state) for r in joined.itertuples()}
    g = bid.groupby("day")
    out["q15"] = {(day,): (len(f), int(f.cheap.sum()), int(f.mid.sum()), int(f.dear.sum()), f.bidder.nunique(),
                           f.auction.nunique()) for day, f in g}
    out["q16"] = {(ch,): (len(f), f.bidder.nunique(), f.auction.nunique(), int(f.cheap.sum()))
                  for ch, f in bid.groupby("channel")}
    out["q17"] = {(a,): (len(f), int(f.cheap.sum()), int(f.price.min()), int(f.price.max()), int(f.price.sum()))
                  for a, f in bid.groupby("auction")}
    out["q18"] = {(b, a): (int(f.price.iloc[-1]),) for (b, a), f in bid.groupby(["bidder", "auction"])}
    out["q19"] = {(a,): (tuple(sorted(f.price.tolist(), reverse=True)[:10]),) for a, f in bid.groupby("auction")}
    return out


def _got(query: str, rt) -> dict:
    from catalog.mapping import row_of
    from spark_jobs import jobs

    table = jobs.load_table(query, rt)[0]
    rows = [row_of(table, k, v) for k, v in jobs.state_rows(query, rt).items()]
    shape = {"q3": (("id",), ("seller", "category", "name", "city", "state")),
             "q15": (("day",), ("total_bids", "rank1_bids", "rank2_bids", "rank3_bids", "total_bidders",
                                "total_auctions")),
             "q16": (("channel",), ("total_bids", "total_bidders", "total_auctions", "rank1_bids")),
             "q17": (("auction",), ("total_bids", "rank1_bids", "min_price", "max_price", "sum_price")),
             "q18": (("bidder", "auction"), ("price",)),
             "q19": (("auction",), ("top",))}[query]
    out = {}
    for row in rows:
        values = tuple(row[c] for c in shape[1])
        if query == "q19":
            values = (tuple(sorted((e[0] if isinstance(e, (list, tuple)) else e for e in row["top"]), reverse=True)),)
        out[tuple(row[c] for c in shape[0])] = values
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--port", type=int, default=29792)
    args = parser.parse_args()

    from bench.broker import private_broker
    from catalog.runtime import Runtime
    from spark_jobs import jobs
    from spark_jobs.engine import session

    with private_broker(args.port) as cfg:
        produced = produce(cfg.kafka_bootstrap, Config(events=args.events), prefix="nexmark-")
        print(f"produced {json.dumps(produced['counts'])} in {produced['seconds']}s", flush=True)
        root = Path(tempfile.mkdtemp(prefix="bench-nexmark-"))
        tables = root / "tables"
        tables.mkdir()
        for name, text in {**SOURCES, **QUERIES}.items():
            header = "-- max_records_per_batch: 5000000\n" if name.startswith("q") and name != "q3" else ""
            (tables / f"{name}.sql").write_text(header + text.format(prefix="nexmark-"))
        rt = Runtime(bootstrap=cfg.kafka_bootstrap, data_dir=root / "data", snapshot_uri=str(root / "data" / "s"),
                     tables_dir=tables, namespace="nexmark.")
        spark = session.get_or_create("bench-nexmark")
        reference = expected(_frames(cfg.kafka_bootstrap, produced["topics"]))
        results = []
        for query in ("auction", "person", *QUERIES):
            started = time.monotonic()
            done = jobs.run(query, until_caught_up=True, spark=spark, rt=rt, snapshots=False)
            seconds = time.monotonic() - started
            if query in SOURCES:
                continue
            got, want = _got(query, rt), reference[query]
            differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))[:5]
            read = produced["counts"]["auction"] if query == "q3" else produced["counts"]["bid"]
            row = {"query": query, "batches": len(done), "seconds": round(seconds, 2),
                   "events_per_s": round(read / seconds), "rows": len(got),
                   "check": "ok" if not differ else {"differing_keys": [list(k) for k in differ],
                                                       "got": [got.get(k) for k in differ],
                                                       "want": [want.get(k) for k in differ]}}
            print(f"  {query}: {row['events_per_s']:,} events/s, {row['rows']} rows, {row['check'] if row['check'] == 'ok' else 'DIFFERS'}",
                  flush=True)
            results.append(row)
        spark.stop()
    print(json.dumps({"events": args.events, "produced": produced, "queries": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
