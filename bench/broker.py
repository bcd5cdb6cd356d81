"""A private Kafka broker for one benchmark run, on its own ports and folder."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile


@contextlib.contextmanager
def private_broker(port: int):
    """The broker's folder (and the drivers' scratch in it) goes with the broker, unless the
    caller named the stack folder."""
    made = None
    if "STATETABLE_STACK_DIR" not in os.environ:
        made = os.environ["STATETABLE_STACK_DIR"] = tempfile.mkdtemp(prefix="statetable-bench-")
    os.environ.setdefault("STATETABLE_KAFKA_PORT", str(port))
    os.environ.setdefault("STATETABLE_KAFKA_CONTROLLER_PORT", str(port + 1))
    from deploy import kafka_server
    from catalog import settings

    cfg = settings.load()
    kafka_server.start(cfg)
    try:
        kafka_server.wait_healthy(cfg)
        yield cfg
    finally:
        kafka_server.process(cfg).stop()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
            del os.environ["STATETABLE_STACK_DIR"]
