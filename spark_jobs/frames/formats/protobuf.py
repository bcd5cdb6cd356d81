"""`-- format: protobuf-confluent`: Protobuf values framed with their schema's id and message index.

After the magic byte and the 4-byte id, Confluent's framing names which message of the .proto
the payload is: a zigzag varint count, then that many zigzag varint indexes (the path through
nested messages); a lone 0 byte is the first top-level message. The .proto text the registry
holds is compiled once per id by protoc (grpcio-tools, Google's compiler in a wheel): the
registry's `format=serialized` form is not the same across registries (Apicurio's is not base64).

A record's fields go to the columns of the same name, as every format reads. Protobuf has no
absent scalar in proto3: an unset field reads as its default (0, "", false), as every Protobuf
reader sees it; a field with presence (`optional`, a message) that is unset is null. Enums read
as their names, google.protobuf.Timestamp as epoch milliseconds, bytes as base64. A writer schema
whose field a column of that name cannot hold (a string where a BIGINT column reads, a nested
message anywhere but a Timestamp) makes its records `schema_incompatible`; a .proto that imports
anything but Google's well-known types, or that protoc refuses, too. A payload that does not parse
as the named message is `malformed_protobuf`.
"""
from __future__ import annotations

import base64
import json
import math
import tempfile
from functools import lru_cache
from pathlib import Path

from catalog.definitions import TableDefinition
from spark_jobs.errors import MalformedFraming
from spark_jobs.frames.formats.wire import RegistryFormat, Refused

_TIMESTAMP = "google.protobuf.Timestamp"
# Field types (FieldDescriptor.TYPE_*) a column of each type can hold.
_INTS = {3, 4, 5, 6, 7, 13, 15, 16, 17, 18}          # int64 uint64 int32 fixed64 fixed32 uint32 sfixed32/64 sint32/64
_HOLDS = {"BIGINT": _INTS, "LONG": _INTS, "INT": _INTS, "DOUBLE": _INTS | {1, 2}, "FLOAT": _INTS | {1, 2},
          "DECIMAL": _INTS | {1, 2}, "STRING": {9, 14}, "BOOLEAN": {8}, "TIMESTAMP": _INTS | {9}, "DATE": {9} | _INTS}
_MESSAGE, _ENUM, _BYTES = 11, 14, 12


def _varint(data: bytes, at: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if at >= len(data) or shift > 63:
            raise MalformedFraming("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def message_indexes(payload: bytes) -> tuple[list[int], int]:
    """(the message index path, where the message's bytes start)."""
    count, at = _varint(payload, 0)
    count = _zigzag(count)
    if count == 0:
        return [0], at
    if count < 0 or count > 64:
        raise MalformedFraming("impossible message index count")
    path = []
    for _ in range(count):
        index, at = _varint(payload, at)
        path.append(_zigzag(index))
    return path, at


def _serialized(text: str):
    """A schema registered as a base64 FileDescriptorProto (confluent-kafka's Python serializer
    registers them so; Confluent's registry turns them into .proto text, others keep them)."""
    import binascii

    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, DecodeError):
        return None
    return proto if proto.message_type else None


@lru_cache(maxsize=64)
def compile_proto(text: str):
    """The .proto's FileDescriptor, compiled by protoc (or read from its serialized form); None if
    it cannot be, or imports another registered schema, which this reader does not follow."""
    import importlib.resources

    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    if (serialized := _serialized(text.strip())) is not None:
        return _pool_file([*_well_known(serialized), serialized])
    with tempfile.TemporaryDirectory(prefix="statetable-proto-") as folder:
        source, out = Path(folder) / "schema.proto", Path(folder) / "schema.desc"
        source.write_text(text)
        well_known = str(importlib.resources.files("grpc_tools") / "_proto")
        code = protoc.main(["protoc", f"-I{folder}", f"-I{well_known}", "--include_imports",
                            f"--descriptor_set_out={out}", str(source)])
        if code != 0 or not out.exists():
            return None
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return _pool_file(list(files))


def _well_known(proto) -> list:
    """The well-known types a serialized schema imports, as protobuf itself ships them."""
    import importlib

    from google.protobuf import descriptor_pb2

    out = []
    for name in proto.dependency:
        if not name.startswith("google/protobuf/"):
            return [None]
        module = importlib.import_module("google.protobuf." + name.split("/")[-1].removesuffix(".proto") + "_pb2")
        out.append(descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb))
    return out


def _pool_file(files: list):
    from google.protobuf import descriptor_pool

    if any(f is None or not f.name.startswith("google/protobuf/") for f in files[:-1]):
        return None
    pool = descriptor_pool.DescriptorPool()
    for proto in files:
        pool.Add(proto)
    return pool.FindFileByName(files[-1].name)


def _message(file, path: list[int]):
    """The message a framing's index path names, or None. An index is zigzag-encoded, so a damaged
    path can be negative: it names no message (Python's -1 would quietly pick the last one)."""
    messages = file.message_types_by_name
    if not path or not 0 <= path[0] < len(file.message_types_by_name):
        return None
    ordered = list(messages.values())
    descriptor = ordered[path[0]]
    for index in path[1:]:
        if not 0 <= index < len(descriptor.nested_types):
            return None
        descriptor = descriptor.nested_types[index]
    return descriptor


def compatible(table: TableDefinition, descriptor) -> bool:
    for name, dtype in table.schema:
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        if field.is_repeated:
            return False
        if field.type == _MESSAGE:
            if field.message_type.full_name != _TIMESTAMP or dtype.split("(")[0] != "TIMESTAMP":
                return False
        elif field.type not in _HOLDS[dtype.split("(")[0]]:
            return False
    return True


def _plain(field, value):
    if field.type == _MESSAGE and field.message_type.full_name == _TIMESTAMP:
        return value.seconds * 1000 + value.nanos // 1_000_000
    if field.type == _ENUM:
        found = field.enum_type.values_by_number.get(value)
        return found.name if found else value
    if field.type == _BYTES:
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)             # a DOUBLE column dead-letters it as wrong_type, as JSON's rule is
    return value


def to_json(message, table: TableDefinition) -> bytes:
    out = {}
    for name, _ in table.schema:
        field = message.DESCRIPTOR.fields_by_name.get(name)
        if field is None:
            continue
        if field.has_presence and not message.HasField(name):
            out[name] = None
        else:
            out[name] = _plain(field, getattr(message, name))
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()


class RegistryProtobuf(RegistryFormat):
    schema_type = "PROTOBUF"

    def __init__(self, table, schemas) -> None:
        super().__init__(table, schemas)
        self.verdicts: dict = {}           # message descriptor (per schema id) -> whether the columns hold it

    def prepare(self, text: str):
        """The .proto's FileDescriptor."""
        return compile_proto(text) or Refused("schema_incompatible")

    def read(self, payload: bytes, prepared) -> tuple[bytes | None, str | None]:
        from google.protobuf.message import DecodeError
        from google.protobuf.message_factory import GetMessageClass

        try:
            path, start = message_indexes(payload)
        except MalformedFraming:
            return None, "malformed_protobuf"
        descriptor = _message(prepared, path)
        if descriptor is None:
            return None, "malformed_protobuf"
        if descriptor not in self.verdicts:      # once per message type and batch, not per record
            self.verdicts[descriptor] = compatible(self.table, descriptor)
        if not self.verdicts[descriptor]:
            return None, "schema_incompatible"
        try:
            message = GetMessageClass(descriptor).FromString(payload[start:])
        except (DecodeError, RuntimeWarning, ValueError):
            return None, "malformed_protobuf"
        return to_json(message, self.table), None
