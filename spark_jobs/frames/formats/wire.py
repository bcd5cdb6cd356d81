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


def framed(values):
    """Which values (a pyarrow binary array) are in the wire format: at least the header, magic
    byte first; null for none. The vectorised `split`, for a whole batch."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.fill_null(pc.and_(pc.greater_equal(pc.binary_length(values), HEADER),
                                pc.equal(pc.binary_slice(values, 0, 1), pa.scalar(bytes([MAGIC]), pa.binary()))),
                        False)


class Refused(str):
    """A schema id's verdict that its records are dead letters, with this reason."""


class RegistryFormat:
    """What every format in the wire format shares: the framing, one lookup and one verdict per
    schema id and batch, and the reasons that come before the payload is read. A format names
    the registry's type it reads and says how one id's schema is prepared (`prepare`) and how a
    payload is read with it (`read`)."""

    schema_type = ""

    def __init__(self, table, schemas: Schemas) -> None:
        self.table, self.schemas = table, schemas
        self.prepared: dict[int, object] = {}          # schema id -> prepare()'s answer, or Refused

    def decode(self, raw: bytes) -> tuple[bytes | None, str | None]:
        framed = split(raw)
        if framed is None:
            return None, "not_wire_format"
        schema_id, payload = framed
        prepared = self.lookup(schema_id)
        return (None, str(prepared)) if isinstance(prepared, Refused) else self.read(payload, prepared)

    def lookup(self, schema_id: int):
        """prepare()'s answer for this id, or Refused: once per id and batch."""
        if schema_id not in self.prepared:
            found = self.schemas(schema_id)
            self.prepared[schema_id] = Refused("unknown_schema_id") if found is None else \
                Refused("schema_incompatible") if found.schema_type != self.schema_type else self.prepare(found.text)
        return self.prepared[schema_id]

    def prepare(self, text: str):
        """What reading this schema's records needs, or Refused(reason) for all of them."""
        raise NotImplementedError

    def read(self, payload: bytes, prepared) -> tuple[bytes | None, str | None]:
        raise NotImplementedError
