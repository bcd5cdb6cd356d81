"""state.codec.text_prefix: a string prefix over order-preserving keys."""
from __future__ import annotations

from state import codec


def test_a_text_prefix_finds_every_string_key_that_starts_with_it_and_no_other():
    keys = [("cust1",), ("cust10",), ("cust19",), ("cust2",), ("cus",), ("cust1\x00x",), (1,), (("cust1",),)]
    prefix = codec.text_prefix("cust1")
    upper = codec.prefix_upper_bound(prefix)
    found = sorted(k for k in keys if prefix <= codec.encode_key(k) < upper)
    assert found == sorted([("cust1",), ("cust10",), ("cust19",), ("cust1\x00x",)])
    # The component prefix (a tuple) finds the whole string only.
    whole = codec.encode_key(("cust1",))
    plain = [k for k in keys if k != ("cust1\x00x",)]
    assert [k for k in plain if codec.encode_key(k).startswith(whole)] == [("cust1",)]


def test_a_row_of_pairs_encodes_leaf_by_leaf_as_each_leaf_alone_does_and_decodes_back():
    """A row of (order, value) pairs (LATEST_BY_OFFSET's state) takes an inlined path for its ints
    and strings; its bytes are each leaf's own bytes, as a one-element value encodes them, inside
    the two tuples' tags, for every kind of leaf (edge ints, a NUL in a string, the ones that take
    the general path), and decode to the row."""
    import decimal

    import pytest

    leaves = [0, -1, (1 << 63) - 1, -(1 << 63), "", "Google", "a\x00b", "é€𝄞", None, True, False, 1.5, -0.0,
              decimal.Decimal("12.30"), b"\x00\x01", (3, "x")]

    def alone(leaf) -> bytes:                    # FORMAT_VERSION, TUPLE, <leaf>, END
        return codec.encode_value((leaf,))[2:-1]

    row = tuple((i, leaf) for i, leaf in enumerate(leaves))
    want = bytes([codec.FORMAT_VERSION, 0x50]) + b"".join(
        b"\x50" + alone(i) + alone(leaf) + b"\x00" for i, leaf in enumerate(leaves)) + b"\x00"
    assert codec.encode_value(row) == want
    assert codec.decode_value(want) == row
    with pytest.raises(codec.CodecError, match="64 bits"):
        codec.encode_value(((1 << 63, "x"),))
