"""The `statetable` command line."""
from __future__ import annotations

import argparse
import os
import sys

from deploy import settings as stack_settings


def _stack(args) -> int:
    from deploy import stack

    cfg = stack_settings.load()
    if args.action == "up":
        stack.up(cfg)
    elif args.action == "down":
        stack.down(cfg)
    else:
        lines = stack.status_lines(cfg)
        print("\n".join(lines))
        return 0 if all(line.endswith(" up") for line in lines) else 3
    return 0


def _smoke(args) -> int:
    from deploy import smoke

    smoke.run(stack_settings.load(), events=args.events)
    return 0


def _airflow(args) -> int:
    from deploy import airflow_server

    airflow_args = args.airflow_args[1:] if args.airflow_args[:1] == ["--"] else args.airflow_args
    return airflow_server.airflow_cli(stack_settings.load(), *airflow_args, check=False).returncode


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="statetable", description="Fault-tolerant, queryable state tables.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("stack", help="start, stop or inspect the local Kafka + Airflow stack")
    p.add_argument("action", choices=["up", "down", "status"])
    p.set_defaults(func=_stack)

    p = sub.add_parser("smoke", help="produce sample events and run the smoke DAG end to end")
    p.add_argument("--events", type=int, default=1000)
    p.set_defaults(func=_smoke)

    p = sub.add_parser("airflow", help="run the airflow CLI against the local stack (e.g. backfill create ...)")
    p.add_argument("airflow_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_airflow)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
