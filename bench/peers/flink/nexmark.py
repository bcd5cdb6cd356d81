"""Apache Flink SQL peer for bench/nexmark: the Nexmark repository's own query texts (q3, q4, q5,
q7, q8, q9, q11, q12, q15-q20), over the same JSON topics statetable reads, RocksDB state, exactly-once checkpoints,
mini-batch.

The Nexmark texts read views over one union topic and write to a blackhole; here the `bid`,
`auction` and `person` views are Kafka sources over `<prefix>bid` and the others (bounded at the
offsets present at start, so each job ends by itself, with Nexmark's watermark 4 s behind the
newest event time), and each query writes to
an upsert-kafka topic keyed by its primary key (q7, append-only, to a Kafka topic keyed by its
columns), read back afterwards (last value per key) for the answer check. The SELECTs are
Nexmark's, unchanged, but for q12's window over the bid's time instead of processing time. Writes <out>/result.json: per query the seconds and the rows. Standalone
on purpose: it imports nothing of statetable's (it runs in its own venv, .bench/venvs/flink).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pyflink.version import __version__ as flink_version

from flink_job import latest_by_key, output_topic, table_env

COUNTS = """
     count(*) AS total_bids,
     count(*) filter (where price < 10000) AS rank1_bids,
     count(*) filter (where price >= 10000 and price < 1000000) AS rank2_bids,
     count(*) filter (where price >= 1000000) AS rank3_bids"""
DISTINCTS = """,
     count(distinct bidder) AS total_bidders,
     count(distinct bidder) filter (where price < 10000) AS rank1_bidders,
     count(distinct bidder) filter (where price >= 10000 and price < 1000000) AS rank2_bidders,
     count(distinct bidder) filter (where price >= 1000000) AS rank3_bidders,
     count(distinct auction) AS total_auctions,
     count(distinct auction) filter (where price < 10000) AS rank1_auctions,
     count(distinct auction) filter (where price >= 10000 and price < 1000000) AS rank2_auctions,
     count(distinct auction) filter (where price >= 1000000) AS rank3_auctions"""
# Nexmark's auction and person, as the generator writes them
SOURCES = {
    "auction": "id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, "
               "`dateTime` TIMESTAMP_LTZ(3), expires TIMESTAMP_LTZ(3), seller BIGINT, category BIGINT, extra VARCHAR",
    "person": "id BIGINT, name VARCHAR, emailAddress VARCHAR, creditCard VARCHAR, city VARCHAR, state VARCHAR, "
              "`dateTime` TIMESTAMP_LTZ(3), extra VARCHAR",
}
RANKS = "rank1_{0} BIGINT, rank2_{0} BIGINT, rank3_{0} BIGINT"
# (sink columns with the primary key, Nexmark's SELECT)
QUERIES = {
    # q3's rows are appends (an inner join of two append streams): a plain Kafka sink keyed by the auction
    "q3": ("name VARCHAR, city VARCHAR, state VARCHAR, id BIGINT",
           "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P on A.seller = P.id "
           "WHERE A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')"),
    "q4": ("id BIGINT, final BIGINT, PRIMARY KEY (id) NOT ENFORCED",
           "SELECT Q.category, AVG(Q.final) FROM (SELECT MAX(B.price) AS final, A.category FROM auction A, bid B "
           "WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires GROUP BY A.id, A.category) Q "
           "GROUP BY Q.category"),
    # q7's sink columns follow its SELECT (Nexmark's sink lists bidder before price and inserts by position)
    # and, being append-only (a join of appends), goes to a plain Kafka sink keyed by its columns.
    "q9": ("id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, "
           "`dateTime` TIMESTAMP_LTZ(3), expires TIMESTAMP_LTZ(3), seller BIGINT, category BIGINT, extra VARCHAR, "
           "auction BIGINT, bidder BIGINT, price BIGINT, bid_dateTime TIMESTAMP_LTZ(3), bid_extra VARCHAR, "
           "PRIMARY KEY (id) NOT ENFORCED",
           "SELECT id, itemName, description, initialBid, reserve, `dateTime`, expires, seller, category, extra, "
           "auction, bidder, price, bid_dateTime, bid_extra FROM (SELECT A.*, B.auction, B.bidder, B.price, "
           "B.`dateTime` AS bid_dateTime, B.extra AS bid_extra, ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY "
           "B.price DESC, B.`dateTime` ASC) AS rownum FROM auction A, bid B WHERE A.id = B.auction AND B.`dateTime` "
           "BETWEEN A.`dateTime` AND A.expires) WHERE rownum <= 1"),
    # q5: Nexmark's text with one more column, the window's start (AuctionBids.starttime), so that
    # its rows can be checked window by window; the max of the counts retracts, so an upsert sink
    "q5": ("auction BIGINT, num BIGINT, starttime TIMESTAMP(3), PRIMARY KEY (starttime, auction) NOT ENFORCED",
           "SELECT AuctionBids.auction, AuctionBids.num, AuctionBids.starttime FROM (SELECT auction, count(*) AS num, "
           "window_start AS starttime, window_end AS endtime FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), "
           "INTERVAL '2' SECOND, INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end) AS AuctionBids "
           "JOIN (SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime FROM (SELECT count(*) AS num, "
           "window_start AS starttime, window_end AS endtime FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), "
           "INTERVAL '2' SECOND, INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end) AS CountBids "
           "GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids ON AuctionBids.starttime = MaxBids.starttime "
           "AND AuctionBids.endtime = MaxBids.endtime AND AuctionBids.num >= MaxBids.maxn"),
    # q8's rows are appends (a join of two windows' appends): a plain Kafka sink keyed by (id, starttime)
    "q8": ("id BIGINT, name VARCHAR, starttime TIMESTAMP(3)",
           "SELECT P.id, P.name, P.starttime FROM (SELECT id, name, window_start AS starttime, window_end AS endtime "
           "FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) "
           "GROUP BY id, name, window_start, window_end) P JOIN (SELECT seller, window_start AS starttime, "
           "window_end AS endtime FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) "
           "GROUP BY seller, window_start, window_end) A "
           "ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"),
    "q7": ("auction BIGINT, price BIGINT, bidder BIGINT, `dateTime` TIMESTAMP_LTZ(3), extra VARCHAR",
           "SELECT B.auction, B.price, B.bidder, B.`dateTime`, B.extra from bid B JOIN (SELECT MAX(price) AS maxprice, "
           "window_end as `dateTime` FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) "
           "GROUP BY window_start, window_end) B1 ON B.price = B1.maxprice "
           "WHERE B.`dateTime` BETWEEN B1.`dateTime` - INTERVAL '10' SECOND AND B1.`dateTime`"),
    "q11": ("bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP_LTZ(3), endtime TIMESTAMP_LTZ(3), "
            "PRIMARY KEY (bidder, starttime) NOT ENFORCED",
            "SELECT B.bidder, count(*) as bid_count, SESSION_START(B.`dateTime`, INTERVAL '10' SECOND) as starttime, "
            "SESSION_END(B.`dateTime`, INTERVAL '10' SECOND) as endtime FROM bid B "
            "GROUP BY B.bidder, SESSION(B.`dateTime`, INTERVAL '10' SECOND)"),
    # q12: Nexmark's text over the bid's own time (DESCRIPTOR(`dateTime`)) for its processing time
    "q12": ("bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3), "
            "PRIMARY KEY (bidder, starttime) NOT ENFORCED",
            "SELECT bidder, count(*) as bid_count, window_start AS starttime, window_end AS endtime "
            "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) "
            "GROUP BY bidder, window_start, window_end"),
    "q15": ("`day` VARCHAR, total_bids BIGINT, " + RANKS.format("bids") + ", total_bidders BIGINT, "
            + RANKS.format("bidders") + ", total_auctions BIGINT, " + RANKS.format("auctions")
            + ", PRIMARY KEY (`day`) NOT ENFORCED",
            "SELECT DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`," + COUNTS + DISTINCTS
            + " FROM bid GROUP BY DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')"),
    "q16": ("channel VARCHAR, `day` VARCHAR, `minute` VARCHAR, total_bids BIGINT, " + RANKS.format("bids")
            + ", total_bidders BIGINT, " + RANKS.format("bidders") + ", total_auctions BIGINT, "
            + RANKS.format("auctions") + ", PRIMARY KEY (channel, `day`) NOT ENFORCED",
            "SELECT channel, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`, "
            "max(DATE_FORMAT(`dateTime`, 'HH:mm')) as `minute`," + COUNTS + DISTINCTS
            + " FROM bid GROUP BY channel, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')"),
    "q17": ("auction BIGINT, `day` VARCHAR, total_bids BIGINT, " + RANKS.format("bids") + ", min_price BIGINT, "
            "max_price BIGINT, avg_price BIGINT, sum_price BIGINT, PRIMARY KEY (auction, `day`) NOT ENFORCED",
            "SELECT auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`," + COUNTS + ", min(price) AS min_price, "
            "max(price) AS max_price, avg(price) AS avg_price, sum(price) AS sum_price "
            "FROM bid GROUP BY auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')"),
    "q18": ("auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, `dateTime` TIMESTAMP_LTZ(3), "
            "extra VARCHAR, PRIMARY KEY (bidder, auction) NOT ENFORCED",
            "SELECT auction, bidder, price, channel, url, `dateTime`, extra FROM (SELECT *, ROW_NUMBER() OVER "
            "(PARTITION BY bidder, auction ORDER BY `dateTime` DESC) AS rank_number FROM bid) WHERE rank_number <= 1"),
    "q19": ("auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, `dateTime` TIMESTAMP_LTZ(3), "
            "extra VARCHAR, rank_number BIGINT, PRIMARY KEY (auction, rank_number) NOT ENFORCED",
            "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number "
            "FROM bid) WHERE rank_number <= 10"),
    # q20's rows are appends (an inner join of two append streams): a plain Kafka sink, keyed by the bid
    "q20": ("auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, bid_dateTime TIMESTAMP_LTZ(3), "
            "bid_extra VARCHAR, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, "
            "auction_dateTime TIMESTAMP_LTZ(3), expires TIMESTAMP_LTZ(3), seller BIGINT, category BIGINT, "
            "auction_extra VARCHAR",
            "SELECT auction, bidder, price, channel, url, B.`dateTime`, B.extra, itemName, description, initialBid, "
            "reserve, A.`dateTime`, expires, seller, category, A.extra FROM bid AS B INNER JOIN auction AS A on "
            "B.auction = A.id WHERE A.category = 10"),
}
KEYS = {"q3": ("id",), "q8": ("id", "starttime"), "q20": ("auction", "bidder", "price", "bid_dateTime"), "q7": ("auction", "bidder", "dateTime", "price"), "q11": ("bidder", "starttime"), "q12": ("bidder", "starttime"), "q15": ("day",),
        "q16": ("channel", "day"), "q17": ("auction", "day"), "q18": ("bidder", "auction"), "q19": ("auction", "rank_number")}


def run(query: str, args) -> dict:
    out_topic = output_topic(args.bootstrap, f"{args.prefix}{query}")
    t_env = table_env(args.connector_jar, args.parallelism, Path(args.out) / "checkpoints" / query, **{
        "table.local-time-zone": "UTC",
        "restart-strategy.type": "none",        # a failure ends the run, not a restart loop
        # Flink's documented tuning for aggregations (mini-batch, two-phase, split distinct)
        "table.exec.mini-batch.enabled": "true", "table.exec.mini-batch.allow-latency": "1s",
        "table.exec.mini-batch.size": "5000", "table.optimizer.agg-phase-strategy": "TWO_PHASE",
        "table.optimizer.distinct-agg.split.enabled": "true",
        # q5's rows retract (its max moves) under a key of the window and the auction that is not the
        # join's upsert key: Flink 2.3 then asks for ON CONFLICT; false is 2.4's default, DEDUPLICATE
        "table.exec.sink.require-on-conflict": "false",
    })
    t_env.execute_sql(f"""
        CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
                          `dateTime` TIMESTAMP_LTZ(3), extra VARCHAR,
                          WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND) WITH (
          'connector' = 'kafka', 'topic' = '{args.prefix}bid',
          'properties.bootstrap.servers' = '{args.bootstrap}', 'properties.group.id' = '{out_topic}',
          'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset',
          'format' = 'json', 'json.timestamp-format.standard' = 'ISO-8601')""")
    for name, fields in SOURCES.items():
        t_env.execute_sql(f"""
            CREATE TABLE {name} ({fields}, WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND) WITH (
              'connector' = 'kafka', 'topic' = '{args.prefix}{name}',
              'properties.bootstrap.servers' = '{args.bootstrap}', 'properties.group.id' = '{out_topic}-{name}',
              'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset',
              'format' = 'json', 'json.timestamp-format.standard' = 'ISO-8601')""")
    columns, select = QUERIES[query]
    connector = "'connector' = 'upsert-kafka'" if "PRIMARY KEY" in columns else \
        f"'connector' = 'kafka', 'key.fields' = '{';'.join(KEYS[query])}', 'key.json.timestamp-format.standard' = " \
        "'ISO-8601'"      # at least once, as upsert-kafka's sinks of the other queries
    t_env.execute_sql(f"""
        CREATE TABLE sink ({columns}) WITH (
          {connector}, 'topic' = '{out_topic}',
          'properties.bootstrap.servers' = '{args.bootstrap}',
          'key.format' = 'json', 'value.format' = 'json', 'value.json.timestamp-format.standard' = 'ISO-8601')""")
    started = time.perf_counter()
    t_env.execute_sql(f"INSERT INTO sink {select}").wait()
    seconds = time.perf_counter() - started
    rows = read_upserts(args.bootstrap, out_topic)
    return {"seconds": round(seconds, 3), "rows": rows}


def read_upserts(bootstrap: str, topic: str) -> list[dict]:
    """The job's rows: every key's last value in its output topic, key columns included."""
    return [{**json.loads(key), **json.loads(value)} for key, value in latest_by_key(bootstrap, topic).items()
            if value is not None]


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--prefix", "--out", "--connector-jar"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--queries", nargs="+", default=list(QUERIES))
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()
    results = {}
    for query in args.queries:
        results[query] = run(query, args)
        print(f"flink {query}: {results[query]['seconds']} s, {len(results[query]['rows'])} rows", flush=True)
    Path(args.out, "result.json").write_text(json.dumps(
        {"system": "Apache Flink SQL (mini-batch)", "version": flink_version, "queries": results}))


if __name__ == "__main__":
    main()
