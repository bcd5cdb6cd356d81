"""The Nexmark queries as statetable tables, and their answers: by pandas over the events read
back (as Nexmark's SQL defines them), and by any system's rows in one shape, so that
bench/nexmark (`python -m bench.nexmark`) can check statetable and its peers alike.
"""
from __future__ import annotations

import json


SESSION_GAP_MS = Q7_WINDOW_MS = Q8_WINDOW_MS = Q12_WINDOW_MS = Q5_SIZE_MS = 10_000
Q5_SLIDE_MS = 2_000
BID = ("-- topic: {prefix}bid\n-- schema: auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
       "dateTime TIMESTAMP, extra STRING\n-- partitions: 4\n")
AUCTION_FIELDS = ("id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, "
                  "dateTime TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra STRING")
AUCTION = "-- topic: {prefix}auction\n-- schema: " + AUCTION_FIELDS + "\n-- partitions: 4\n"
PERSON = ("-- topic: {prefix}person\n-- schema: id BIGINT, name STRING, city STRING, state STRING, dateTime TIMESTAMP\n"
          "-- partitions: 4\n")
# An auction's bids inside its open window, as a windowed join of the two streams: an auction waits
# until the watermark passes its expiry, a bid until it passes its own time (plus the grace).
OPEN_BIDS = (AUCTION + "-- join_topic: {prefix}bid\n-- join_schema: auction BIGINT, bidder BIGINT, price BIGINT, "
             "channel STRING, url STRING, dateTime TIMESTAMP, extra STRING\n-- join_grace: 10s\n")
OPEN_WINDOW = "ON a.id = b.auction AND b.dateTime BETWEEN a.dateTime AND a.expires"
DAY = "DATE_FORMAT(dateTime, 'yyyy-MM-dd')"
RANKS = (("rank1", "price < 10000"), ("rank2", "price >= 10000 AND price < 1000000"), ("rank3", "price >= 1000000"))
COUNTS = "COUNT(*) AS total_bids, " + ", ".join(f"COUNT(CASE WHEN {when} THEN 1 END) AS {rank}_bids"
                                               for rank, when in RANKS)
DISTINCTS = "".join(f", COUNT(DISTINCT {col}) AS total_{col}s" + "".join(
    f", COUNT(DISTINCT CASE WHEN {when} THEN {col} END) AS {rank}_{col}s" for rank, when in RANKS)
    for col in ("bidder", "auction"))
# Each query as a statetable table, with the Nexmark repository's columns (queries/qN.sql): the
# same answer written in statetable's dialect (FILTER (WHERE ...) as CASE, ROW_NUMBER's top 1 as
# LATEST_BY_OFFSET, its top 10 as TOPK).
QUERIES = {
    # q3 (local item suggestion): category 10's auctions by sellers in Oregon, Idaho or California
    "q3": "CREATE TABLE q3 AS SELECT a.id, p.name, p.city, p.state FROM auction a JOIN person p ON a.seller = p.id "
          "WHERE a.category = 10 AND (p.state = 'OR' OR p.state = 'ID' OR p.state = 'CA');",
    # q4 (average closing price per category): the bids inside their auction's open window, the
    # highest per auction, averaged per category (Flink's AVG of a BIGINT is a BIGINT, truncated).
    # Nexmark's nested SELECT is a table of its own here (CHAINS: q4_final), which this reads.
    "q4": "CREATE TABLE q4 AS SELECT category, CAST(SUM(final) / COUNT(*) AS BIGINT) AS avg_final "
          "FROM q4_final GROUP BY category;",
    # q7 (highest bid per 10-second window): the top bids of each tumbling window, those at its
    # highest price being Nexmark's answer (TOPK keeps 10, ties beyond that would be cut)
    "q7": BID + "-- window_retention: 30d\nCREATE TABLE q7 AS SELECT window_start, MAX(price) AS maxprice, "
                "TOPK(10, price, auction, bidder) AS top FROM bid GROUP BY TUMBLE(dateTime, INTERVAL '10' SECOND);",
    # q11 (user sessions): each bidder's bids per session, a session ending after 10 s without one
    "q11": BID + "-- window_retention: 30d\nCREATE TABLE q11 AS SELECT bidder, COUNT(*) AS bid_count, window_start AS starttime, "
                 "window_end AS last_bid FROM bid GROUP BY bidder, SESSION(dateTime, INTERVAL '10' SECOND);",
    # q12 (bids per bidder per 10-second window): Nexmark counts by processing time, whose windows
    # no two systems (nor two runs) share; its event-time form counts by the bid's time instead
    "q12": BID + "-- window_retention: 30d\nCREATE TABLE q12 AS SELECT bidder, COUNT(*) AS bid_count, "
                 "window_start AS starttime, window_end AS endtime FROM bid GROUP BY bidder, "
                 "TUMBLE(dateTime, INTERVAL '10' SECOND);",
    # q15 (bidding statistics per day)
    "q15": BID + f"CREATE TABLE q15 AS SELECT {DAY} AS day, {COUNTS}{DISTINCTS} FROM bid GROUP BY {DAY};",
    # q16 (channel statistics per day)
    "q16": BID + f"CREATE TABLE q16 AS SELECT channel, {DAY} AS day, MAX(DATE_FORMAT(dateTime, 'HH:mm')) AS minute, "
                 f"{COUNTS}{DISTINCTS} FROM bid GROUP BY channel, {DAY};",
    # q17 (auction statistics per day); Flink's AVG of a BIGINT is a BIGINT (truncated)
    "q17": BID + f"CREATE TABLE q17 AS SELECT auction, {DAY} AS day, {COUNTS}, MIN(price) AS min_price, "
                 "MAX(price) AS max_price, CAST(SUM(price) / COUNT(*) AS BIGINT) AS avg_price, SUM(price) AS sum_price "
                 f"FROM bid GROUP BY auction, {DAY};",
    # q18 (each bidder's last bid on each auction)
    "q18": BID + "CREATE TABLE q18 AS SELECT bidder, auction, LATEST_BY_OFFSET(price, false) AS price, "
                 "LATEST_BY_OFFSET(channel, false) AS channel, LATEST_BY_OFFSET(url, false) AS url, "
                 "LATEST_BY_OFFSET(dateTime, false) AS dateTime, LATEST_BY_OFFSET(extra, false) AS extra "
                 "FROM bid GROUP BY bidder, auction;",
    # q19 (the 10 highest bids of each auction)
    "q19": BID + "CREATE TABLE q19 AS SELECT auction, TOPK(10, price, bidder) AS top FROM bid GROUP BY auction;",
    # q9 (winning bids): each auction's highest bid inside its open window, the earliest of equal
    # ones (Nexmark's ROW_NUMBER() ... ORDER BY price DESC, dateTime ASC as TOPK(1, ...), whose ties
    # go to the smaller row: the earlier dateTime); a chain: q9_join, then this aggregate over it
    "q9": "-- topic: {prefix}q9-join\n-- schema: auction BIGINT, bidder BIGINT, price BIGINT, dateTime BIGINT\n"
          "-- partitions: 4\nCREATE TABLE q9 AS SELECT auction, TOPK(1, price, dateTime, bidder) AS winner "
          "FROM q9_changes GROUP BY auction;",
    # q5 (hot items): each sliding window's auctions with the most bids. A chain: q5_counts counts
    # bids per auction and HOP window; this reads its change topic as a stream and keeps each
    # window's highest count and its top counts (a count only grows, so its newest is its highest:
    # the entries at the maximum are distinct auctions; TOPK keeps 20, ties beyond would be cut).
    "q5": "-- topic: {prefix}q5-counts\n-- schema: auction BIGINT, window_start BIGINT, num BIGINT\n-- partitions: 4\n"
          "CREATE TABLE q5 AS SELECT window_start, MAX(num) AS maxn, TOPK(20, num, auction) AS top "
          "FROM q5_changes GROUP BY window_start;",
    # q8 (monitor new users): people who opened an auction in the 10-second window they joined in,
    # as an aggregate over a windowed join of the person and auction streams: the two are in one
    # 10-second window when their times are within 10 s of each other and fall in the same window
    # (the WHERE); Nexmark's key (id, name, window) is the person's, who has one event.
    # The window's start is the person's time floored to 10 s (answers), as TIMESTAMPs are epoch
    # milliseconds in a join's WHERE.
    "q8": PERSON + "-- join_topic: {prefix}auction\n-- join_schema: " + AUCTION_FIELDS + "\n-- join_grace: 10s\n"
                   "CREATE TABLE q8 AS SELECT p.id, p.name, p.dateTime AS person_time, COUNT(*) AS auctions "
                   "FROM person p JOIN auction a ON p.id = a.seller AND a.dateTime BETWEEN p.dateTime - INTERVAL "
                   f"'10' SECOND AND p.dateTime + INTERVAL '10' SECOND WHERE a.dateTime - a.dateTime % {Q8_WINDOW_MS} "
                   f"= p.dateTime - p.dateTime % {Q8_WINDOW_MS} GROUP BY p.id, p.name, p.dateTime;",
    # q20 (expanded bids of category 10): each bid with its auction; a bid before its auction joins when it comes
    "q20": BID + "CREATE TABLE q20 AS SELECT b.auction, b.bidder, b.price, b.channel, b.dateTime, a.itemName, "
                 "a.initialBid, a.reserve, a.seller, a.category FROM bid b JOIN auction a ON b.auction = a.id "
                 "WHERE a.category = 10;",
}
# The tables a query's table reads, in the order they run (each on the one before's change topic);
# the query's seconds are the chain's. Their change topics carry no batch header (a statetable
# table reads them by key and value, as Flink's upsert-kafka sinks write none).
CHAINS = {
    "q5": {
        "q5_counts": BID + "-- output_topic: {prefix}q5-counts\n-- output_headers: none\n-- window_retention: 30d\nCREATE TABLE q5_counts AS "
                           f"SELECT auction, COUNT(*) AS num FROM bid GROUP BY auction, HOP(dateTime, INTERVAL "
                           f"'{Q5_SIZE_MS // 1000}' SECOND, INTERVAL '{Q5_SLIDE_MS // 1000}' SECOND);",
    },
    # q4: Nexmark's inner SELECT, an aggregate over the windowed join: each auction's bids are
    # folded into its highest where they pair, never kept or published as pairs. Grouped by the
    # auction alone (its category is the auction's: MAX), so that q4 can read its change topic.
    "q4": {
        "q4_final": OPEN_BIDS + "-- output_topic: {prefix}q4-final\n-- output_headers: none\nCREATE TABLE q4_final AS SELECT a.id AS "
                                f"auction, MAX(a.category) AS category, MAX(b.price) AS final FROM auction a JOIN bid b "
                                f"{OPEN_WINDOW} GROUP BY a.id;",
    },
    "q9": {
        "q9_join": OPEN_BIDS + "-- output_topic: {prefix}q9-join\n-- output_headers: none\nCREATE TABLE q9_join AS SELECT b.auction, "
                               f"b.bidder, b.price, b.dateTime FROM auction a JOIN bid b {OPEN_WINDOW};",
    },
}
COLUMNS = {      # the columns each query's check compares, after its key columns
    "q3": (("id",), ("name", "city", "state")),
    "q4": (("category",), ("avg_final",)),
    "q9": (("auction",), ("price", "bidder", "dateTime")),
    "q8": (("id",), ("name", "starttime")),
    "q5": (("window_start", "auction"), ("num",)),
    "q7": (("window_start",), ("maxprice", "bids")),
    "q11": (("bidder", "starttime"), ("bid_count", "last_bid")),
    "q12": (("bidder", "starttime"), ("bid_count",)),
    "q15": (("day",), tuple(f"{r}_{c}" for c in ("bids", "bidders", "auctions") for r in ("total", "rank1", "rank2", "rank3"))),
    "q16": (("channel", "day"), ("minute",) + tuple(f"{r}_{c}" for c in ("bids", "bidders", "auctions")
                                                   for r in ("total", "rank1", "rank2", "rank3"))),
    "q17": (("auction", "day"), ("total_bids", "rank1_bids", "rank2_bids", "rank3_bids", "min_price", "max_price",
                                 "avg_price", "sum_price")),
    "q18": (("bidder", "auction"), ("price", "channel", "url", "dateTime", "extra")),
    "q19": (("auction",), ("top",)),
    "q20": ((), ("auction", "bidder", "price", "channel", "dateTime", "itemName", "initialBid", "reserve", "seller",
                 "category")),
}
MULTISETS = ("q20",)     # rows without a key of their own (a bid's join): compared as {row: how many}
SOURCES = {
    "auction": "CREATE TABLE auction (id BIGINT PRIMARY KEY, itemName STRING, description STRING, initialBid BIGINT, "
               "reserve BIGINT, dateTime TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra STRING) "
               "WITH (topic='{prefix}auction');",
    "person": "CREATE TABLE person (id BIGINT PRIMARY KEY, name STRING, city STRING, state STRING, dateTime TIMESTAMP) "
              "WITH (topic='{prefix}person');",
}


def _values(bootstrap: str, topic: str) -> list[bytes]:
    """A topic's values in partition and offset order (read back, not regenerated)."""
    from tests.table_env import read_topic

    return [m.value() for m in sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset()))]


def _frames(values: dict[str, list[bytes]]) -> dict:
    """Each kind's events as pandas, from its values (_values)."""
    import pandas as pd

    return {kind: pd.DataFrame([json.loads(v) for v in kind_values]) for kind, kind_values in values.items()}


def expected(frames: dict, queries=None) -> dict:
    """Each query's answer by pandas, as Nexmark's SQL defines it: {query: {key tuple: values}};
    `queries`: only these (the per-group ones take minutes over 2M events)."""
    import pandas as pd

    want = set(queries or QUERIES)
    bid, auction, person = frames["bid"], frames["auction"], frames["person"]
    bid = bid.assign(day=bid["dateTime"].str[:10], minute=bid["dateTime"].str[11:16],
                     rank1=bid["price"] < 10000, rank2=(bid["price"] >= 10000) & (bid["price"] < 1_000_000),
                     rank3=bid["price"] >= 1_000_000, ms=pd_ms(bid["dateTime"]))
    out = {}
    joined = auction.merge(person, left_on="seller", right_on="id", suffixes=("", "_p"))
    joined = joined[(joined["category"] == 10) & joined["state"].isin(["OR", "ID", "CA"])]
    if "q3" in want:
        out["q3"] = {(r.id,): (r.name, r.city, r.state) for r in joined.itertuples()}
    a = auction.assign(a_ms=pd_ms(auction["dateTime"]), expires_ms=pd_ms(auction["expires"]))
    bids = bid.merge(a.drop(columns=["dateTime"]), left_on="auction", right_on="id", suffixes=("", "_a"))
    open_bids = bids[(bids["ms"] >= bids["a_ms"]) & (bids["ms"] <= bids["expires_ms"])]
    final = open_bids.groupby("id").agg(category=("category", "max"), final=("price", "max"))
    if "q4" in want:
        out["q4"] = {(int(c),): (int(f.final.sum()) // len(f),) for c, f in final.groupby("category")}
    winners = open_bids.sort_values(["price", "ms"], ascending=[False, True], kind="stable").groupby("auction").head(1)
    starts = [bid.assign(window_start=bid["ms"] // Q5_SLIDE_MS * Q5_SLIDE_MS - back)
              for back in range(0, Q5_SIZE_MS, Q5_SLIDE_MS)]          # every HOP window a bid falls in
    counts = pd.concat(starts).groupby(["window_start", "auction"]).size().rename("num").reset_index()
    hot = counts[counts["num"] == counts.groupby("window_start")["num"].transform("max")]
    if "q5" in want:
        out["q5"] = {(int(r.window_start), int(r.auction)): (int(r.num),) for r in hot.itertuples()}
    p = person.assign(w=pd_ms(person["dateTime"]) // Q8_WINDOW_MS * Q8_WINDOW_MS)
    sellers = auction.assign(w=pd_ms(auction["dateTime"]) // Q8_WINDOW_MS * Q8_WINDOW_MS)[["seller", "w"]]
    q8 = p.merge(sellers.drop_duplicates(), left_on=["id", "w"], right_on=["seller", "w"])
    if "q8" in want:
        out["q8"] = {(int(r.id),): (r.name, int(r.w)) for r in q8.itertuples()}
    if "q9" in want:
        out["q9"] = {(int(r.auction),): (int(r.price), int(r.bidder), int(r.ms)) for r in winners.itertuples()}
    q20 = bids[bids["category"] == 10]
    if "q20" in want:
        out["q20"] = _counted(zip(*(q20[c] if c != "dateTime" else q20["ms"] for c in COLUMNS["q20"][1])))

    def counts(f) -> tuple:
        ranks = [f[r] for r in ("rank1", "rank2", "rank3")]
        return (len(f), *(int(r.sum()) for r in ranks))

    def distincts(f) -> tuple:
        ranks = [f[r] for r in ("rank1", "rank2", "rank3")]
        return tuple(v for col in ("bidder", "auction") for v in (f[col].nunique(), *(f[col][r].nunique() for r in ranks)))

    def per(groups, values) -> dict:
        return {key if isinstance(key, tuple) else (key,): values(f) for key, f in groups}

    windows = bid.assign(window_start=bid["ms"] - bid["ms"] % Q7_WINDOW_MS)
    if "q7" in want:
        out["q7"] = {(w,): (int(f.price.max()), tuple(sorted((int(r.auction), int(r.bidder))
                                                           for r in f[f.price == f.price.max()].itertuples())))
                     for w, f in windows.groupby("window_start")}
    if "q11" in want:
        out["q11"] = _sessions(bid, SESSION_GAP_MS)
    if "q12" in want:
        out["q12"] = {(int(b), int(w)): (len(f),) for (b, w), f in windows.groupby(["bidder", "window_start"])}
    if "q15" in want:
        out["q15"] = per(bid.groupby("day"), lambda f: counts(f) + distincts(f))
    if "q16" in want:
        out["q16"] = per(bid.groupby(["channel", "day"]), lambda f: (f.minute.max(),) + counts(f) + distincts(f))
    if "q17" in want:
        out["q17"] = per(bid.groupby(["auction", "day"]), lambda f: counts(f) + (
            int(f.price.min()), int(f.price.max()), int(f.price.sum()) // len(f), int(f.price.sum())))
    last = bid.groupby(["bidder", "auction"]).tail(1)
    if "q18" in want:
        out["q18"] = {(r.bidder, r.auction): (r.price, r.channel, r.url, r.ms, r.extra) for r in last.itertuples()}
    if "q19" in want:
        out["q19"] = per(bid.groupby("auction"), lambda f: (tuple(sorted(f.price.tolist(), reverse=True)[:10]),))
    return out


def _sessions(bid, gap_ms: int) -> dict:
    """q11 by pandas: per bidder, runs of bids no more than the gap apart (inclusive, as statetable
    and ksqlDB close a session, and as Flink's session windows merge when they touch)."""
    ordered = bid.sort_values(["bidder", "ms"], kind="stable")
    new = (ordered["bidder"] != ordered["bidder"].shift()) | (ordered["ms"] - ordered["ms"].shift() > gap_ms)
    groups = ordered.assign(session=new.cumsum()).groupby("session")
    return {(int(f.bidder.iloc[0]), int(f.ms.iloc[0])): (len(f), int(f.ms.iloc[-1])) for _, f in groups}


def exact_gaps(bid, gap_ms: int = SESSION_GAP_MS) -> int:
    """Consecutive bids of a bidder exactly the session gap apart: the boundary every system must
    agree on (one session), counted so a run shows it was exercised."""
    ordered = bid.sort_values(["bidder", "ms"], kind="stable")
    same = ordered["bidder"] == ordered["bidder"].shift()
    return int(((ordered["ms"] - ordered["ms"].shift() == gap_ms) & same).sum())


def pd_ms(text):
    import pandas as pd

    return (pd.to_datetime(text, utc=True).astype("int64") // 1_000_000).astype("int64")


def _counted(rows) -> dict:
    """{row: how many times}, each value a plain Python one (numpy's integers compare, but print long)."""
    out: dict = {}
    for row in rows:
        row = tuple(v.item() if hasattr(v, "item") else v for v in row)
        out[row] = out.get(row, 0) + 1
    return out


def answers(query: str, rows: list[dict]) -> dict:
    """A system's rows as {key tuple: values} in COLUMNS' order; a top-10 as its prices, sorted."""
    keys, values = COLUMNS[query]
    if query in MULTISETS:
        return _counted(tuple(row[c] for c in values) for row in rows)
    out = {}
    if query == "q5":             # statetable's rows: a window's top counts, those at its maximum
        rows = [{"window_start": r["window_start"], "auction": e[1], "num": e[0]} for r in rows
                for e in r["top"] if e[0] == r["maxn"]] if rows and "top" in rows[0] else rows
    for row in rows:
        if query == "q9" and "winner" in row:     # statetable's TOPK(1) entry [price, dateTime, bidder]
            (price, ms, bidder), = row["winner"]
            row = {**row, "price": price, "bidder": bidder, "dateTime": ms}
        if query == "q8" and "person_time" in row:     # statetable's person's time: its window's start
            row = {**row, "starttime": row["person_time"] - row["person_time"] % Q8_WINDOW_MS}
        if query == "q7" and "top" in row:     # statetable's TOPK entries [price, auction, bidder] at the max
            row = {**row, "bids": tuple(sorted((e[1], e[2]) for e in row["top"] if e[0] == row["maxprice"]))}
        got = tuple(row[c] for c in values)
        if query == "q19":
            got = (tuple(sorted((e[0] if isinstance(e, (list, tuple)) else e for e in row["top"]), reverse=True)),)
        out[tuple(row[c] for c in keys)] = got
    return out


def differing(got: dict, want: dict) -> dict | str:
    """"ok", or the first differing keys with both answers."""
    differ = sorted((k for k in set(got) | set(want) if got.get(k) != want.get(k)), key=str)[:5]
    if not differ:
        return "ok"
    return {"differing_keys": [list(k) for k in differ], "got": [got.get(k) for k in differ],
            "want": [want.get(k) for k in differ], "rows": [len(got), len(want)]}
