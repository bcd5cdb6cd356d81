"""Generated record values for the fuzzing suite: valid events and every hostile shape a
producer can send (lone and paired surrogates, invalid UTF-8, NUL, huge and tiny numbers,
NaN and Infinity, wrong types, deep nesting, values near the size limits, two objects in one
value, empty values), from a seed, so a failure is replayed from the seed it prints."""
from __future__ import annotations

import json
import random

SCHEMA = [("k", "STRING"), ("v", "BIGINT"), ("x", "DOUBLE"), ("t", "TIMESTAMP"), ("flag", "BOOLEAN"), ("d", "DATE")]
# DATE text at and past its range and in the forms one reader takes and another does not.
DATES = ["0000-01-01", "0001-01-01", "9999-12-31", "10000-01-01", "+10000-01-01", "-0001-01-01", "20240101",
         "2024-W01-1", " 2024-01-01", "2024-01-01 ", "2024-02-30", "2024-1-1", "2024", "2024-01-01T00:00:00",
         "\u0662024-01-01", 19723, "", "1970-01-01"]
# Nesting around the limit (999 with the record's own object: arrow_values.MAX_JSON_DEPTH) and far past it.
DEPTHS = [300, 998, 999, 1000, 1001, 5000, 100_000]
KEYS = ["a", "b", "c", "caf\u00e9", "\U0001F600", "with \"quotes\"", "nul\u0000byte", "  spaced  ", "", "1"]


def _valid(rng: random.Random) -> dict:
    event = {"k": rng.choice(KEYS)}
    if rng.random() < 0.9:
        event["v"] = rng.choice([rng.randint(-1000, 1000), rng.randint(-2 ** 40, 2 ** 40), None])
    if rng.random() < 0.9:
        event["x"] = rng.choice([rng.uniform(-1e6, 1e6), 0.0, -0.0, 5e-324, 1.7e308, None, rng.randint(-9, 9)])
    if rng.random() < 0.8:
        event["t"] = rng.choice([
            f"2026-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
            rng.randint(0, 1_800_000_000_000), str(rng.randint(0, 1_800_000_000_000)),
            "1969-12-31T23:59:59.999500", "2026-01-01T00:00:00.123456+02:00", None])
    if rng.random() < 0.8:
        event["flag"] = rng.choice([True, False, None])
    if rng.random() < 0.5:
        event["d"] = f"{rng.randint(1990, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return event


def _hostile(rng: random.Random) -> bytes:
    base = _valid(rng)
    field = rng.choice([name for name, _ in SCHEMA])
    text = json.dumps(base, ensure_ascii=rng.random() < 0.5)
    choice = rng.randrange(28)
    if choice == 0:
        return text.replace('"k": ', '"k": "\\ud800", "_": ', 1).encode()
    if choice == 1:
        return text.encode()[:-1] + b', "k": "\\udfff"}'
    if choice == 2:
        return text.encode().replace(b'"k": "', b'"k": "\xff\xfe', 1)
    if choice == 3:
        return json.dumps({**base, field: float("nan")}).encode()                 # the bare token NaN
    if choice == 4:
        return json.dumps({**base, field: float("inf")}).encode()                 # Infinity
    if choice == 5:
        return text[:-1].encode() + f', "{field}": 1e400}}'.encode()
    if choice == 6:
        return text[:-1].encode() + f', "{field}": {"9" * rng.randint(19, 40)}}}'.encode()
    if choice == 7:
        return json.dumps({**base, field: rng.choice(["12", "abc", [1, 2], {"a": 1}, True, 1.5])}).encode()
    if choice == 8:
        depth = rng.choice(DEPTHS)
        nested = "[" * depth + "]" * depth if rng.random() < 0.7 else '{"a":' * depth + "1" + "}" * depth
        where = rng.choice(["top", "deep", "k", "string"])
        if where == "top":
            return nested.encode()
        if where == "string":                                   # brackets inside a string are text
            return json.dumps({**base, "deep": nested}).encode()
        return (text[:-1] + f', "{where}": {nested}}}').encode()
    if choice == 9:
        return b"null"
    if choice == 10:
        return rng.choice([b"[]", b"42", b'"text"', b"true"])
    if choice == 11:
        return rng.choice([b"", b" ", b"\n", b"\t\r\n"])
    if choice == 12:
        return text.encode() + text.encode()                                      # two objects
    if choice == 13:
        return text.encode()[:rng.randint(1, max(1, len(text) - 1))]              # cut short
    if choice == 14:
        return text.encode().replace(b"{", b"{\x00", 1)
    if choice == 15:
        return json.dumps({**base, "k": "k" * rng.randint(10_000, 100_000)}).encode()
    if choice == 16:
        return (b'{"k": "' + b"x" * rng.randint(1_040_000, 1_048_000)) if rng.random() < 0.3 else text.encode()
    if choice == 17:
        return json.dumps({**base, "t": "\u0661\u0662\u0663"}).encode()             # Arabic-Indic digits
    if choice == 18:
        return json.dumps({**base, "t": rng.choice([10 ** 18, -(10 ** 17), 9_300_000_000_000_000, 253402300800000,
                                                  -62135596800001, "0001-01-01T00:00:00Z"])}).encode()
    if choice == 19:
        return ('{"k": "a", "k": "b", "v": 1}' if rng.random() < 0.5 else '{"v": 1, "v": "x", "k": "a"}').encode()
    if choice == 20:
        return (" " + text + " ").encode()                                        # whitespace around an object
    if choice == 21:
        return text.replace(": ", ":\n ", 1).encode()                             # a newline inside
    if choice == 22:
        return json.dumps({**base, "v": rng.choice([2 ** 63, -(2 ** 63) - 1, 2 ** 63 - 1, -(2 ** 63)])}).encode()
    if choice == 23:
        return json.dumps({**base, "x": rng.choice([1e-320, -1e308, 3.4e38, 1.0e16])}).encode()
    if choice == 24:
        return json.dumps({"K": "upper", "v": 1}).encode()                       # the key field missing
    if choice == 26:
        return json.dumps({**base, "d": rng.choice(DATES)}).encode()
    if choice == 27:
        return json.dumps({**base, "d": rng.choice(DATES), "t": rng.choice(DATES)}).encode()
    return json.dumps({**base, "v": None, "x": None, "flag": None}).encode()


def values(seed: int, count: int) -> list[bytes]:
    """`count` record values, about one in three hostile."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        if rng.random() < 0.65:
            out.append(json.dumps(_valid(rng), ensure_ascii=rng.random() < 0.5).encode())
        else:
            out.append(_hostile(rng))
    return out


def kafka_key(rng: random.Random) -> bytes | None:
    return rng.choice([None, b"", b"k", b"\xff\x00", bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))])
