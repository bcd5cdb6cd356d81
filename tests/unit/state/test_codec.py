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
