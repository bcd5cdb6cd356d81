"""Byte encodings for keys and values.

Keys use an order-preserving tuple encoding: each component is a type tag plus
a self-delimiting body, so the bytes of a tuple prefix are a byte prefix of
the tuple, and byte order equals tuple order. That makes prefix scans ("all
windows of key k") and range scans ("windows of k from t1 to t2") plain
RocksDB iterations, also for composite keys such as (key, window_start).

Values carry a one-byte format version ahead of the same tuple encoding. The
encoding is compact (no field names, varint-free fixed ints) and has no
pickle, so any process or language can read it.
"""
from __future__ import annotations

import decimal
import struct
from state.errors import CodecError

__all__ = ["CodecError", "FORMAT_VERSION", "add_ints", "decode_key", "decode_value", "encode_key",
           "encode_value", "prefix_upper_bound", "text_prefix"]

FORMAT_VERSION = 1

_NONE, _FALSE, _TRUE, _INT, _FLOAT, _STR, _BYTES, _TUPLE, _END = (
    0x01, 0x02, 0x03, 0x10, 0x20, 0x30, 0x40, 0x50, 0x00,
)
# A DECIMAL as its exact text (a fixed scale per column, so equal values have equal bytes). Its
# byte order is not numeric order: range scans over a DECIMAL key component are not offered.
_DECIMAL = 0x28
_INT_BIAS = 1 << 63
_pack_q = struct.Struct(">Q").pack
_unpack_q = struct.Struct(">Q").unpack_from
_pack_d = struct.Struct(">d").pack
_unpack_d = struct.Struct(">d").unpack_from


def _escape(raw: bytes) -> bytes:
    # 0x00 terminates a string, so a literal 0x00 becomes 0x00 0xFF.
    return raw.replace(b"\x00", b"\x00\xff") + b"\x00"


_pack_tagged_q = struct.Struct(">BQ").pack


def _encode_into(out: bytearray, item) -> None:
    # The exact types a state holds most (ints, strings, tuples) first, by identity of their
    # type: an isinstance chain cost a q18 row of five (order, value) pairs 8.8 us, most of a
    # commit's per-key time. A subclass (bool among them) takes the general path.
    kind = type(item)
    if kind is int:
        if not -_INT_BIAS <= item < _INT_BIAS:
            raise CodecError(f"integer {item} does not fit in 64 bits")
        out += _pack_tagged_q(_INT, item + _INT_BIAS)
    elif kind is str:
        raw = item.encode()
        out.append(_STR)
        out += raw.replace(b"\x00", b"\x00\xff") if b"\x00" in raw else raw
        out.append(0)
    elif kind is tuple:
        out.append(_TUPLE)
        for element in item:
            if type(element) is tuple:
                # a row of (order, value) pairs (LATEST_BY_OFFSET, TOPK): its ints and strings
                # without a call each, the rest through the general path
                out.append(_TUPLE)
                for leaf in element:
                    leaf_kind = type(leaf)
                    if leaf_kind is int and -_INT_BIAS <= leaf < _INT_BIAS:
                        out += _pack_tagged_q(_INT, leaf + _INT_BIAS)
                    elif leaf_kind is str and "\x00" not in leaf:
                        out.append(_STR)
                        out += leaf.encode()
                        out.append(0)
                    else:
                        _encode_into(out, leaf)
                out.append(_END)
            else:
                _encode_into(out, element)
        out.append(_END)
    else:
        _encode_other(out, item)


def _encode_other(out: bytearray, item) -> None:
    if item is None:
        out.append(_NONE)
    elif item is True:
        out.append(_TRUE)
    elif item is False:
        out.append(_FALSE)
    elif isinstance(item, int):
        if not -_INT_BIAS <= item < _INT_BIAS:
            raise CodecError(f"integer {item} does not fit in 64 bits")
        out.append(_INT)
        out += _pack_q(item + _INT_BIAS)
    elif isinstance(item, float):
        bits = _unpack_q(_pack_d(item))[0]
        # Flip so that byte order matches numeric order, negatives included.
        bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits & (1 << 63) else bits | (1 << 63)
        out.append(_FLOAT)
        out += _pack_q(bits)
    elif isinstance(item, str):
        out.append(_STR)
        out += _escape(item.encode())
    elif isinstance(item, decimal.Decimal):
        if not item.is_finite():
            raise CodecError(f"cannot encode DECIMAL {item}")
        out.append(_DECIMAL)
        out += _escape(str(item).encode())
    elif isinstance(item, (bytes, bytearray)):
        out.append(_BYTES)
        out += _escape(bytes(item))
    elif isinstance(item, (tuple, list)):
        out.append(_TUPLE)
        for element in item:
            _encode_into(out, element)
        out.append(_END)
    else:
        raise CodecError(f"cannot encode {type(item).__name__} value {item!r}")


def _read_escaped(data: bytes, pos: int) -> tuple[bytes, int]:
    end = data.find(b"\x00", pos)
    if end < 0:
        raise CodecError("unterminated string")
    if end + 1 >= len(data) or data[end + 1] != 0xFF:      # no escaped 0x00 in it: the common case
        return data[pos:end], end + 1
    chunks = []
    while True:
        end = data.find(b"\x00", pos)
        if end < 0:
            raise CodecError("unterminated string")
        chunks.append(data[pos:end])
        if end + 1 < len(data) and data[end + 1] == 0xFF:
            chunks.append(b"\x00")
            pos = end + 2
            continue
        return b"".join(chunks), end + 1


def _decode_at(data: bytes, pos: int):
    tag = data[pos]
    pos += 1
    if tag == _TUPLE:
        items = []
        append = items.append
        while True:
            tag = data[pos]
            if tag == _INT:              # inline: ints and plain strings are most of what a state holds
                append(_unpack_q(data, pos + 1)[0] - _INT_BIAS)
                pos += 9
            elif tag == _END:
                return tuple(items), pos + 1
            elif tag == _STR and 0 < (end := data.find(b"\x00", pos + 1)) and \
                    (end + 1 == len(data) or data[end + 1] != 0xFF):
                append(data[pos + 1:end].decode())
                pos = end + 1
            else:
                item, pos = _decode_at(data, pos)
                append(item)
    if tag == _INT:
        return _unpack_q(data, pos)[0] - _INT_BIAS, pos + 8
    if tag == _STR:
        raw, pos = _read_escaped(data, pos)
        return raw.decode(), pos
    if tag == _FLOAT:
        bits = _unpack_q(data, pos)[0]
        bits = bits ^ (1 << 63) if bits & (1 << 63) else bits ^ 0xFFFFFFFFFFFFFFFF
        return _unpack_d(_pack_q(bits))[0], pos + 8
    if tag == _NONE:
        return None, pos
    if tag == _TRUE:
        return True, pos
    if tag == _FALSE:
        return False, pos
    if tag == _BYTES:
        return _read_escaped(data, pos)
    if tag == _DECIMAL:
        raw, pos = _read_escaped(data, pos)
        return decimal.Decimal(raw.decode()), pos
    raise CodecError(f"unknown type tag 0x{tag:02x} at byte {pos - 1}")


def encode_key(key: tuple) -> bytes:
    """Order-preserving bytes of a key tuple; a tuple prefix encodes to a byte prefix."""
    if not isinstance(key, tuple):
        key = (key,)
    out = bytearray()
    for component in key:
        _encode_into(out, component)
    return bytes(out)


def decode_key(data: bytes) -> tuple:
    items, pos = [], 0
    try:
        while pos < len(data):
            item, pos = _decode_at(data, pos)
            items.append(item)
    except (IndexError, struct.error) as exc:
        raise CodecError(f"truncated key {data!r}") from exc
    return tuple(items)


def text_prefix(prefix: str) -> bytes:
    """The bytes every key whose first part is a string starting with `prefix` begins with (the
    string's encoding without its terminator): `cust1` finds `cust1`, `cust10` ... `cust19`."""
    return bytes([_STR]) + _escape(prefix.encode())[:-1]


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with `prefix`."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


# Aggregate states are mostly short tuples of integers (counts, integer
# sums). These structs produce exactly the generic encoding's bytes for them,
# several times faster; other shapes take the generic path.
_INT_TUPLE = {
    k: struct.Struct(">BB" + "BQ" * k + "B") for k in range(1, 5)
}
_unpack_qq = struct.Struct(">QxQ").unpack_from


_pack_1int = _INT_TUPLE[1].pack


def encode_value(value) -> bytes:
    if type(value) is tuple and len(value) == 1 and type(value[0]) is int and -_INT_BIAS <= value[0] < _INT_BIAS:
        return _pack_1int(FORMAT_VERSION, _TUPLE, _INT, value[0] + _INT_BIAS, _END)
    if type(value) is tuple and 0 < len(value) < 5:
        args = [FORMAT_VERSION, _TUPLE]
        for item in value:
            if type(item) is not int or not -_INT_BIAS <= item < _INT_BIAS:
                break
            args.append(_INT)
            args.append(item + _INT_BIAS)
        else:
            args.append(_END)
            return _INT_TUPLE[len(value)].pack(*args)
    out = bytearray([FORMAT_VERSION])
    _encode_into(out, value)
    return bytes(out)


_pack_2int = _INT_TUPLE[2].pack
_UINT64 = 1 << 64


def _biased_int_fields(data: bytes) -> tuple | None:
    """The stored (biased) fields of a value in the one- or two-int fast layout, else None."""
    size = len(data)
    if size == 12 and data[2] == _INT and data[11] == _END and data[1] == _TUPLE and data[0] == FORMAT_VERSION:
        return _unpack_q(data, 3)
    if size == 21 and data[2] == _INT and data[11] == _INT and data[20] == _END and data[1] == _TUPLE \
            and data[0] == FORMAT_VERSION:
        return _unpack_qq(data, 3)
    return None


def add_ints(data: bytes, partial) -> bytes | None:
    """`data` with `partial` added element-wise, straight on the bytes, for a value of one or
    two 64-bit ints (COUNT and integer SUM columns, the commonest tables); None when either
    side has another shape or the sum leaves 64 bits, and the caller takes the generic path.

    It skips building the tuples that decode, merge and encode would, which is most of a
    commit's per-key cost for count tables. Same bytes as the generic path by construction."""
    fields = _biased_int_fields(data)
    if fields is None or type(partial) is not tuple or len(partial) != len(fields):
        return None
    if len(fields) == 1:
        n = partial[0]
        if type(n) is int and 0 <= (n := fields[0] + n) < _UINT64:
            return _pack_1int(FORMAT_VERSION, _TUPLE, _INT, n, _END)
        return None
    a, b = partial
    if type(a) is int and type(b) is int and 0 <= (a := fields[0] + a) < _UINT64 \
            and 0 <= (b := fields[1] + b) < _UINT64:
        return _pack_2int(FORMAT_VERSION, _TUPLE, _INT, a, _INT, b, _END)
    return None


def decode_value(data: bytes):
    fields = _biased_int_fields(data)
    if fields is not None:
        if len(fields) == 1:
            return (fields[0] - _INT_BIAS,)
        return (fields[0] - _INT_BIAS, fields[1] - _INT_BIAS)
    if not data:
        raise CodecError("empty value")
    if data[0] != FORMAT_VERSION:
        raise CodecError(f"value format version {data[0]} is not supported (this build reads {FORMAT_VERSION})")
    try:
        value, pos = _decode_at(data, 1)
    except (IndexError, struct.error) as exc:
        raise CodecError(f"truncated value {data[:40]!r}") from exc
    if pos != len(data):
        raise CodecError(f"{len(data) - pos} trailing bytes after value")
    return value
