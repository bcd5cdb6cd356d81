"""Confluent's wire format: one magic byte (0), the writer schema's id as 4 big-endian bytes,
then the payload. The schema behind an id is looked up by what the pass is handed
(`Schemas`: spark_jobs/steps/schemas.py asks the registry), so a format reads no store itself and
is tested over schemas held in memory."""
from __future__ import annotations

from typing import Callable, NamedTuple

MAGIC = 0
HEADER = 5


class Registered(NamedTuple):
    schema_type: str       # AVRO, JSON or PROTOBUF, as the registry names it
    text: str


# A schema id -> the registered schema, or None for an id the registry does not know.
Schemas = Callable[[int], "Registered | None"]


def split(raw: bytes) -> tuple[int, bytes] | None:
    """(schema id, payload), or None if `raw` is not in the wire format."""
    if len(raw) < HEADER or raw[0] != MAGIC:
        return None
    return int.from_bytes(raw[1:HEADER], "big"), raw[HEADER:]
