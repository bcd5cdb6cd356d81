"""What the CLI prints of producers' bytes and files' text is inert on a terminal (issue 66)."""
from __future__ import annotations

from deploy.cli import _table_lines, shown


def test_control_and_format_characters_are_shown_as_escapes():
    text = shown("k\x1b]52;c;aGk=\x07 x\rforged\u202eevil\x9b2J\nnext é 😀")
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "\u202e" not in text
    assert "\x9b" not in text
    assert "\\x1b]52;c;aGk=\\x07" in text and "\\r" in text and "\\u202e" in text
    assert text.endswith("\nnext é 😀")          # our own newlines and printable text stay


def test_a_broken_definitions_reason_is_printed_inert():
    lines = shown(_table_lines({"table": "t", "broken": "bad.sql:1: table name '\x1b[2J' must match"}))
    assert "\x1b" not in lines and "\\x1b[2J" in lines
