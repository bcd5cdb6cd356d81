"""Nexmark over Kafka with checked answers: statetable beside Flink SQL and Spark Structured
Streaming, query by query.

    .venv/bin/python -m bench.nexmark [--events 2000000] [--rate 1000] [--out docs/benchmarks/nexmark.json]
    (or `make bench-nexmark`)

One private broker; the generator (bench/nexmark/generator.py) writes the events once, as JSON,
into `nexmark-person`, `nexmark-auction` and `nexmark-bid`; every system reads those same
records. The events are read back with a plain Kafka consumer, and pandas computes each query's
answer from them (statetable_queries.expected): statetable's final table and Flink's and Spark's
final outputs (the last value per key of their sink topics) must all equal it, or the run fails
and prints the first differing keys. Per query and system: processing seconds, bid events per
second, the peak RSS of the system's processes, and the ratio to Flink. The bid topic's bytes
are also parsed by pyarrow.json alone, the ceiling a JSON reader sets on the same machine.

The event-time rate defaults to 1,000 events a second, not Nexmark's 10M: each event then has a
millisecond of its own, so "the last bid" (q18) and every window are decided by the data, not
by the order ties happen to arrive in. Writes the JSON and a Markdown report beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.compare.measure import TIMEOUT as PEER_TIMEOUT
from bench.compare.measure import PeerTimeout, run_peer
from bench.nexmark.generator import Config, produce
from bench.nexmark.statetable_queries import (
    Q7_WINDOW_MS, QUERIES, SESSION_GAP_MS, _frames, _values, answers, differing, exact_gaps, expected, pd_ms,
)

PEER_QUERIES = ("q3", "q4", "q5", "q8", "q9", "q7", "q11", "q12", "q15", "q16", "q17", "q18", "q19", "q20")   # Nexmark's texts Flink runs


def json_ceiling(values: list[bytes]) -> dict:
    """pyarrow.json over the topic's value bytes, one record a line: the parse alone."""
    import pyarrow as pa
    import pyarrow.json as pj

    data = b"\n".join(values)
    best = None
    for _ in range(3):
        started = time.perf_counter()
        table = pj.read_json(pa.BufferReader(data))
        best = min(best or 1e9, time.perf_counter() - started)
    return {"records": table.num_rows, "bytes": len(data), "seconds": round(best, 3),
            "records_per_s": round(table.num_rows / best), "mb_per_s": round(len(data) / best / 1e6, 1)}


def run_statetable(bootstrap: str, root: Path, queries: list[str]) -> dict:
    """statetable as a peer of its own (bench/nexmark/statetable_run.py, measured by
    bench.compare.measure like every peer): the peak RSS is its tree's, not this process's pandas."""
    run = run_peer("statetable", [sys.executable, "-m", "bench.nexmark.statetable_run", "--bootstrap", bootstrap,
                                  "--root", root, "--out", root / "result.json", "--queries", *queries], root)
    done = run.result
    for query in queries:
        done[query]["answers"] = answers(query, done[query].pop("rows"))
    done["_peak_rss_mb"] = run.peak_rss_mb
    return done


NOT_FINISHED = "not finished (killed at the timeout)"


def _killed(error: PeerTimeout) -> dict:
    """A query a peer did not finish in the run's time: how long it ran, no answer to check."""
    return {"timed_out": error.seconds}


def run_flink(bootstrap: str, work: Path, queries: tuple[str, ...], timeout: float) -> dict:
    from bench.compare.peers import _venv_python
    from deploy import jars

    connector = next((p for p in jars.jars("flink") if "flink-sql-connector-kafka" in p.name), None)
    if connector is None:
        raise SystemExit("Flink's Kafka connector jar is missing; run `make bench-peers`")
    out = {}
    for query in queries:       # a process per query: its peak RSS and its JVM start are its own
        try:
            run = run_peer(f"flink {query}", [_venv_python("flink"), Path(__file__).parents[1] / "peers" / "flink" /
                                              "nexmark.py", "--bootstrap", bootstrap, "--prefix", "nexmark-", "--out",
                                              work / query, "--connector-jar", connector, "--queries", query],
                           work / query, timeout=timeout)
        except PeerTimeout as error:
            out[query] = _killed(error)
            continue
        done = run.result["queries"][query]
        out[query] = {"seconds": done["seconds"], "whole_seconds": run.wall_seconds, "peak_rss_mb": run.peak_rss_mb,
                      "answers": answers(query, _flink_rows(query, done["rows"]))}
        out["_version"] = run.result["version"]
    return out


def run_spark(bootstrap: str, work: Path, queries: list[str], timeout: float) -> dict:
    """Spark Structured Streaming, a process per query (bench/peers/spark_nexmark.py); a query
    whose text Spark refuses comes back with Spark's error, not a figure."""
    from bench.peers.spark_nexmark import ALL, NOT_TRIED

    out = {q: {"not_tried": NOT_TRIED[q]} for q in queries if q in NOT_TRIED}
    for query in (q for q in queries if q in ALL):
        try:
            run = run_peer(f"spark {query}", [sys.executable, "-m", "bench.peers.spark_nexmark", "--bootstrap",
                                              bootstrap, "--prefix", "nexmark-", "--out", work / query, "--query",
                                              query], work / query, timeout=timeout)
        except PeerTimeout as error:
            out[query] = _killed(error)
            continue
        done = run.result["query"]
        out[query] = done if "refused" in done else {
            "seconds": done["seconds"], "whole_seconds": run.wall_seconds, "peak_rss_mb": run.peak_rss_mb,
            "rewritten": done["rewritten"],
            "answers": answers(query, _spark_rows(query, _sink_rows(bootstrap, done["topic"], done["keyed"])))}
        out["_version"] = run.result["version"]
    return out


def _sink_rows(bootstrap: str, topic: str, keyed: bool) -> list[dict]:
    """A sink topic's answer: every key's last value (an aggregate's updates), or every row (an
    append-only join's, which has no key of its own)."""
    from tests.table_env import read_topic

    records = sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset()))
    values = {m.key(): m.value() for m in records}.values() if keyed else [m.value() for m in records]
    return [json.loads(v) for v in values if v is not None]


def _spark_rows(query: str, rows: list[dict]) -> list[dict]:
    """Spark's rows in statetable's shape: times as epoch milliseconds, AVG's double truncated as
    Flink's BIGINT average is, a session's end (the last bid plus the gap) as its last bid."""
    if query == "q11":
        return [{"bidder": r["bidder"], "starttime": _ms(r["starttime"]), "bid_count": r["bid_count"],
                 "last_bid": _ms(r["endtime"]) - SESSION_GAP_MS} for r in rows]
    if query == "q12":
        return [{**r, "starttime": _ms(r["starttime"])} for r in rows]
    if query in ("q17", "q4"):
        column = "avg_price" if query == "q17" else "avg_final"
        return [{**r, column: int(r[column])} for r in rows]
    if query in ("q18", "q20"):
        return [{**r, "dateTime": _ms(r["dateTime"])} for r in rows]
    return rows


def _flink_rows(query: str, rows: list[dict]) -> list[dict]:
    """Flink's rows in statetable's shape: times as epoch milliseconds, q19's ten rows per
    auction as one list of [price]."""
    if query == "q7":           # its bids at each window's highest price, by the window they fall in
        windows: dict = {}
        for r in rows:
            ms = _ms(r["dateTime"])
            top = windows.setdefault(ms - ms % Q7_WINDOW_MS, [r["price"], []])
            top[1].append((r["auction"], r["bidder"]))
        return [{"window_start": w, "maxprice": price, "bids": tuple(sorted(bids))}
                for w, (price, bids) in windows.items()]
    if query == "q11":          # Flink's session ends a gap after its last bid; statetable's at it
        return [{"bidder": r["bidder"], "starttime": _ms(r["starttime"]), "bid_count": r["bid_count"],
                 "last_bid": _ms(r["endtime"]) - SESSION_GAP_MS} for r in rows]
    if query == "q18":
        return [{**r, "dateTime": _ms(r["dateTime"])} for r in rows]
    if query == "q4":           # Nexmark's sink names the category `id` and its average `final`
        return [{"category": r["id"], "avg_final": r["final"]} for r in rows]
    if query == "q5":
        return [{"window_start": _ms(r["starttime"]), "auction": r["auction"], "num": r["num"]} for r in rows]
    if query in ("q8", "q12"):
        return [{**r, "starttime": _ms(r["starttime"])} for r in rows]
    if query == "q9":
        return [{"auction": r["auction"], "price": r["price"], "bidder": r["bidder"], "dateTime": _ms(r["bid_dateTime"])}
                for r in rows]
    if query == "q20":
        return [{**r, "dateTime": _ms(r["bid_dateTime"])} for r in rows]
    if query == "q19":
        tops: dict = {}
        for r in rows:
            tops.setdefault(r["auction"], []).append([r["price"]])
        return [{"auction": a, "top": top} for a, top in tops.items()]
    return rows


def _spark_row(done: dict, read: int, ours: float, want: dict) -> dict:
    """A query's Spark figures, or Spark's refusal of its text (no figure, nothing to check)."""
    if "refused" in done or "not_tried" in done:
        return done
    if "timed_out" in done:
        return {**done, "check": NOT_FINISHED, "ratio_at_least": round(done["timed_out"] / ours, 2)}
    return {"seconds": done["seconds"], "whole_seconds": done["whole_seconds"], "rewritten": done["rewritten"],
            "events_per_s": round(read / done["seconds"]), "peak_rss_mb": done["peak_rss_mb"],
            "check": differing(done["answers"], want), "ratio": round(done["seconds"] / ours, 2)}


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "")).replace(tzinfo=timezone.utc).timestamp() * 1000)


def _peer_cells(peer: dict, ratio: float | None, bound: float | None) -> tuple[str, str, str]:
    """(seconds (whole process), events/s, ratio) of a peer's run, or of its run killed at the
    run's timeout: its seconds a lower bound, so the ratio is one too."""
    if "timed_out" in peer:
        return f"> {peer['timed_out']:.0f} (killed)", "-", f"> {bound:.2f}x"
    if "seconds" not in peer:
        return "- (-)", "0", "-"
    return (f"{peer['seconds']} ({peer['whole_seconds']})", f"{peer['events_per_s']:,}",
            f"{ratio:.2f}x" if ratio else "-")


def _check(check) -> str:
    return check if isinstance(check, str) else "DIFFERS"


def _slowest(step_ms: dict, top: int = 3) -> str:
    return ", ".join(f"{name} {ms / 1000:.1f}" for name, ms in sorted(step_ms.items(), key=lambda s: -s[1])[:top])


def _spark_lines(result: dict) -> list[str]:
    """The Spark Structured Streaming side: figures where Spark ran the query, its refusal where not."""
    ran, refused, not_tried = ([q for q in result["queries"] if set(kinds) & set(q.get("spark", {}))]
                               for kinds in (("seconds", "timed_out"), ("refused",), ("not_tried",)))
    if not (ran or refused or not_tried):
        return []
    lines = ["", f"Spark Structured Streaming {result.get('spark_version')} (RocksDB state store, changelog "
                 "checkpointing, availableNow, Kafka sink), on the same topics:", "",
             "| query | Spark SS s (whole process) | events/s | statetable / Spark | peak RSS MB | answers | text |",
             "|---|---|---|---|---|---|---|"]
    for q in ran:
        spark = q["spark"]
        seconds, per_s, ratio = _peer_cells(spark, spark.get("ratio"), spark.get("ratio_at_least"))
        lines.append(f"| {q['query']} | {seconds} | {per_s} | {ratio} | {spark.get('peak_rss_mb', '-')} | "
                     f"{_check(spark['check'])} | {'Spark rewrite' if spark.get('rewritten') else 'Nexmark'} |")
    if refused:
        lines += ["", "Spark refuses Nexmark's text (its own error):", ""]
        lines += [f"- {q['query']}: `{q['spark']['refused']}`" for q in refused]
    if not_tried:
        lines += ["", "Not tried in Spark (Flink's window table functions, which Spark SQL has no form of):", ""]
        lines += [f"- {q['query']}: {q['spark']['not_tried']}" for q in not_tried]
    return lines


def report(result: dict) -> str:
    names = [q["query"] for q in result["queries"]]
    subset = "" if set(names) == set(QUERIES) else " --queries " + " ".join(names)
    if result.get("peer_timeout_seconds", PEER_TIMEOUT) != PEER_TIMEOUT:
        subset += f" --peer-timeout {result['peer_timeout_seconds']:.0f}"
    lines = [
        "# Nexmark over Kafka, with checked answers",
        "",
        f"Generated by `python -m bench.nexmark --events {result['events']} --rate {result['rate']}{subset}` on "
        f"{result['cores']} cores ({result['date']}). Every system reads the same "
        f"{result['produced']['counts']['bid']:,} bids ({result['produced']['bytes']['bid'] / 1e6:.0f} MB of JSON) "
        f"of {result['events']:,} events; each answer is checked against pandas over the events read back.",
        "",
        "| query | statetable s | events/s | Flink SQL s (whole process) | events/s | statetable / Flink | "
        "peak RSS statetable / Flink MB | answers | statetable's pass: slowest steps (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for q in result["queries"]:
        flink = q.get("flink") or {}
        seconds, per_s, ratio = _peer_cells(flink, q.get("ratio_to_flink"), q.get("ratio_to_flink_at_least"))
        lines.append(
            f"| {q['query']} | {q['statetable']['seconds']} | {q['statetable']['events_per_s']:,} | "
            f"{seconds} | {per_s} | {ratio} | {result['statetable_peak_rss_mb']} / "
            f"{flink.get('peak_rss_mb', '-')} | statetable {_check(q['statetable']['check'])}, Flink "
            f"{_check(flink.get('check', '-'))} | {q['statetable']['engine']}: {_slowest(q['statetable']['step_ms'])} |")
    lines += _spark_lines(result)
    ceiling = result["json_ceiling"]
    lines += ["", f"JSON ceiling: pyarrow.json parses the bid topic's {ceiling['bytes'] / 1e6:.0f} MB at "
                  f"{ceiling['records_per_s']:,} records/s ({ceiling['mb_per_s']} MB/s) on one core.",
              "", "statetable's seconds are its batches (jobs.run until caught up, one local Spark session "
                  f"started once in {result['statetable_session_seconds']} s); Flink's are the job's, and in "
                  "brackets its process with the JVM start. Events/s counts the bids a query reads "
                  "(q3, q8: auctions)."]
    if result.get("unfinished"):
        lines += ["", f"Killed at the run's peer timeout ({result['peer_timeout_seconds']:.0f} s of its whole "
                      f"process, `--peer-timeout`), so no answer to check: {', '.join(result['unfinished'])}. Its "
                      "seconds are a lower bound, and so is its ratio (which counts its JVM's start too)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--rate", type=int, default=1000, help="events per second of event time")
    parser.add_argument("--port", type=int, default=29792)
    parser.add_argument("--peers", nargs="*", default=["flink", "spark"], choices=["flink", "spark"])
    parser.add_argument("--queries", nargs="+", default=list(QUERIES), choices=list(QUERIES),
                        help="run these queries only (default: every one statetable supports)")
    parser.add_argument("--peer-timeout", type=float, default=PEER_TIMEOUT,
                        help="seconds a peer's query may run (whole process); one killed at it is reported "
                             "as a lower bound, its answer unchecked")
    parser.add_argument("--out", help="write the JSON here and the Markdown report beside it (.md)")
    args = parser.parse_args()

    from bench.broker import private_broker

    # A SIGTERM (a CI job's end, `kill`) unwinds like ^C: the peer running now and the broker stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    root = Path(tempfile.mkdtemp(prefix="bench-nexmark-"))
    with private_broker(args.port) as cfg:
        produced = produce(cfg.kafka_bootstrap, Config(events=args.events, rate=args.rate), prefix="nexmark-")
        print(f"produced {json.dumps(produced['counts'])} in {produced['seconds']} s", flush=True)
        values = {kind: _values(cfg.kafka_bootstrap, topic) for kind, topic in produced["topics"].items()}
        frames = _frames(values)
        reference = expected(frames, args.queries)
        gaps = exact_gaps(frames["bid"].assign(ms=pd_ms(frames["bid"]["dateTime"])))
        ceiling = json_ceiling(values["bid"])        # the same bytes, read once
        del frames, values
        flink = run_flink(cfg.kafka_bootstrap, root / "flink", tuple(q for q in PEER_QUERIES if q in args.queries),
                          args.peer_timeout) if "flink" in args.peers else {}
        spark = run_spark(cfg.kafka_bootstrap, root / "spark", args.queries, args.peer_timeout) \
            if "spark" in args.peers else {}
        ours = run_statetable(cfg.kafka_bootstrap, root / "statetable", args.queries)
    queries, failed, unfinished = [], [], []
    for query in args.queries:
        read = produced["counts"]["auction" if query in ("q3", "q8") else "bid"]
        want = reference[query]
        row = {"query": query, "rows": len(want),
               "statetable": {"seconds": ours[query]["seconds"], "batches": ours[query]["batches"],
                              "events_per_s": round(read / ours[query]["seconds"]), "engine": ours[query]["engine"],
                              "step_ms": ours[query]["step_ms"],
                              "check": differing(ours[query]["answers"], want)}}
        if query in flink and "timed_out" in flink[query]:
            row["flink"] = {**flink[query], "check": NOT_FINISHED}
            row["ratio_to_flink_at_least"] = round(flink[query]["timed_out"] / ours[query]["seconds"], 2)
        elif query in flink:
            f = flink[query]
            row["flink"] = {"seconds": f["seconds"], "whole_seconds": f["whole_seconds"],
                            "events_per_s": round(read / f["seconds"]), "peak_rss_mb": f["peak_rss_mb"],
                            "check": differing(f["answers"], want)}
            row["ratio_to_flink"] = round(f["seconds"] / ours[query]["seconds"], 2)
        if query in spark:
            row["spark"] = _spark_row(spark[query], read, ours[query]["seconds"], want)
        failed += [f"{query} {system}" for system in ("statetable", "flink", "spark")
                   if row.get(system, {}).get("check", "ok") not in ("ok", NOT_FINISHED)]
        unfinished += [f"{query} {system}" for system in ("flink", "spark")
                       if row.get(system, {}).get("check") == NOT_FINISHED]
        queries.append(row)
    result = {"events": args.events, "rate": args.rate, "cores": os.cpu_count(),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "produced": produced,
              "json_ceiling": ceiling, "q11_bids_exactly_a_session_gap_apart": gaps,
              "statetable_session_seconds": ours["_session_seconds"],
              "statetable_peak_rss_mb": ours["_peak_rss_mb"], "flink_version": flink.get("_version"),
              "spark_version": spark.get("_version"),
              "peer_timeout_seconds": args.peer_timeout, "queries": queries, "failed_checks": failed,
              "unfinished": unfinished}
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".md").write_text(report(result))
    if failed:
        sys.exit(f"nexmark: answers differ: {', '.join(failed)}")


if __name__ == "__main__":
    main()
