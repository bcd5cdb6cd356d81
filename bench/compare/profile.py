"""Where statetable's batch time goes: Spark's own stage metrics from its event log.

The micro-batch names its Spark jobs "<table> batch <id>: <step>", so every
stage in the event log maps to a step (read, dead_letters, bronze,
aggregate_merge, mirror). Per step: wall time of its stages, executor run and
CPU time, GC, records read; then the heaviest stages of the slowest step.
Executor run time far above CPU time means tasks waited (on Kafka, on disk, or
on Python workers, whose CPU the JVM does not count).
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

_STEP = re.compile(r"batch (\d+): ([a-z_]+)")


def _events(log_dir: Path):
    for path in sorted(p for p in log_dir.rglob("*") if p.is_file() and not p.name.startswith(".")):
        with path.open() as lines:
            for line in lines:
                yield json.loads(line)


def summarize(log_dir: Path, top: int = 6) -> dict:
    stage_step: dict[int, tuple[int, str]] = {}
    stages = []
    for event in _events(log_dir):
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            match = _STEP.search(event.get("Properties", {}).get("spark.job.description") or "")
            for stage_id in event["Stage IDs"]:
                if match:
                    stage_step[stage_id] = (int(match.group(1)), match.group(2))
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            if info["Stage ID"] not in stage_step or "Completion Time" not in info:
                continue
            metrics = {a["Name"].removeprefix("internal.metrics."): a.get("Value") for a in info["Accumulables"]}
            batch, step = stage_step[info["Stage ID"]]
            stages.append({
                "batch": batch, "step": step, "stage": info["Stage Name"][:90], "tasks": info["Number of Tasks"],
                "wall_ms": info["Completion Time"] - info["Submission Time"],
                "run_ms": int(metrics.get("executorRunTime") or 0),
                "cpu_ms": int(metrics.get("executorCpuTime") or 0) // 1_000_000,
                "gc_ms": int(metrics.get("jvmGCTime") or 0),
                "records_read": int(metrics.get("input.recordsRead") or 0)})
    steps: dict[str, dict] = defaultdict(lambda: {"wall_ms": 0, "run_ms": 0, "cpu_ms": 0, "gc_ms": 0, "stages": 0})
    for s in stages:
        agg = steps[s["step"]]
        for key in ("wall_ms", "run_ms", "cpu_ms", "gc_ms"):
            agg[key] += s[key]
        agg["stages"] += 1
    if not steps:
        return {"steps": {}, "slowest": None, "top_stages": []}
    slowest = max(steps, key=lambda k: steps[k]["wall_ms"])
    heavy = sorted((s for s in stages if s["step"] == slowest), key=lambda s: -s["wall_ms"])[:top]
    return {"steps": dict(steps), "slowest": slowest, "top_stages": heavy}


def pyspy_markdown(summary: dict) -> str:
    lines = [f"py-spy (`py-spy record --subprocesses`, a separate run of the same workload): the driver's main "
             f"thread spent {100 * summary['driver_waiting_on_jvm_share']:.0f}% of {summary['driver_samples']:,} "
             f"samples waiting on the JVM (py4j `send_command`); the {summary['python_workers']} Python workers "
             f"were busy {', '.join(f'{100 * b:.0f}%' for b in summary['python_worker_busy_share'])} of the time "
             "(the aggregate_merge tasks). statetable's own driver frames, inclusive share of samples:", "",
             "| frame | share |", "|---|---|"]
    lines += [f"| `{name}` | {100 * share:.0f}% |" for name, share in summary["driver_top"]]
    return "\n".join(lines) + "\n"


def markdown(summary: dict, batch_steps: list[dict]) -> str:
    """The profile section of the report: the batch log's step times and Spark's stage metrics."""
    if not summary["steps"]:
        return "No Spark event log was captured.\n"
    totals: dict[str, int] = defaultdict(int)
    for batch in batch_steps:
        for key, value in batch.items():
            if key.startswith("ms_"):
                totals[key[3:]] += value
    whole = sum(totals.values()) or 1
    lines = ["Step times summed over every batch of the workload-1 run (from the batch log, wall clock in the "
             "driver) and Spark's stage metrics for the same steps (from the Spark event log of a separate, "
             "profiled run):", "",
             "| step | batch-log ms | share | stage wall ms | executor run ms | executor CPU ms | GC ms |",
             "|---|---|---|---|---|---|---|"]
    for step in sorted(totals, key=lambda k: -totals[k]):
        m = summary["steps"].get(step, {})
        lines.append(f"| {step} | {totals[step]:,} | {100 * totals[step] / whole:.0f}% | {m.get('wall_ms', 0):,} | "
                     f"{m.get('run_ms', 0):,} | {m.get('cpu_ms', 0):,} | {m.get('gc_ms', 0):,} |")
    slowest = max(totals, key=lambda k: totals[k])
    lines += ["", f"Slowest step: **{slowest}**. Its heaviest Spark stages:", "",
              "| batch | stage | tasks | wall ms | executor run ms | CPU ms | GC ms | records read |",
              "|---|---|---|---|---|---|---|---|"]
    heavy = summary["top_stages"] if summary["slowest"] == slowest else []
    for s in heavy:
        lines.append(f"| {s['batch']} | `{s['stage']}` | {s['tasks']} | {s['wall_ms']:,} | {s['run_ms']:,} | "
                     f"{s['cpu_ms']:,} | {s['gc_ms']:,} | {s['records_read']:,} |")
    return "\n".join(lines) + "\n"


def pyspy_summary(speedscope: Path, top: int = 8) -> dict:
    """From a `py-spy record --subprocesses -f speedscope` file: where the driver's main thread spent
    its samples (inclusive, by function), and how busy the Python workers were."""
    data = json.loads(speedscope.read_text())
    frames = data["shared"]["frames"]
    driver = data["profiles"][0]
    counts: dict[str, int] = defaultdict(int)
    ours = ("/spark_jobs/", "/state/")
    for stack in driver["samples"]:
        for name in {f"{frames[f]['name']} ({Path(frames[f]['file']).parent.name}/{Path(frames[f]['file']).name}:"
                     f"{frames[f].get('line')})" for f in stack if any(d in frames[f].get("file", "") for d in ours)}:
            counts[name] += 1
    total = max(len(driver["samples"]), 1)
    waiting = sum(1 for stack in driver["samples"]
                  if any(frames[f]["name"] == "GatewayClient.send_command" for f in stack))
    workers = [p for p in data["profiles"][1:] if "MainThread" in p["name"]]
    busy = [sum(1 for stack in p["samples"] if not any(frames[f]["name"] == "read_int" for f in stack))
            / max(len(p["samples"]), 1) for p in workers]
    return {"driver_samples": total, "driver_waiting_on_jvm_share": round(waiting / total, 3),
            "python_workers": len(workers), "python_worker_busy_share": [round(b, 3) for b in busy],
            "driver_top": sorted(((n, round(c / total, 3)) for n, c in counts.items()), key=lambda x: -x[1])[:top]}
