"""Which files in the tables folder are definitions, and reading one without trusting it.

One rule: whatever goes wrong with one `.sql` file costs that file's table alone. The folder is
written by people and their editors, so it holds lock files (`.#t.sql`, a dangling symlink),
directories, FIFOs, Latin-1 comments and pasted megabytes. Each of those used to raise out of
`load_all`, or block it forever, and so stop every table's DAGs, the CLI and the query server.
Here a file that is not a definition is listed with its reason under a name derived from its
file, and the rest load.

Nesting is measured on SQL tokens before the parser sees them: the parser, the generator and
the expression compiler all recurse, so a definition deeper than they can follow must be refused
by a count, not by the RecursionError it would raise somewhere inside them.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from catalog.errors import DefinitionError

log = logging.getLogger("statetable.definitions")
_warned: set[tuple[str, str]] = set()   # once per process: the dag-processor loads the folder every parse

MAX_DEFINITION_BYTES = 256 * 1024      # a definition is a page of SQL; a larger file is a mistake
MAX_TOKENS = 20_000                    # ... and a few thousand tokens at most
MAX_NESTING = 64                       # parentheses, CASE ... END and NOT/unary minus runs, together
MAX_CHAIN = 256                        # binary operators in one parenthesis level (a left-deep tree)


def definition_files(folder: Path, broken: dict[str, str] | None) -> list[Path]:
    """The regular `*.sql` files of `folder`, sorted. Anything else named `*.sql` is skipped with
    a warning and, when `broken` is given, listed there under its file name."""
    paths = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    for entry in entries:
        if not entry.name.endswith(".sql"):
            continue
        path = Path(folder) / entry.name
        reason = _not_a_definition(path, entry)
        if reason is None:
            paths.append(path)
            continue
        name = entry.name.encode("unicode_escape").decode()      # a file name is a producer's bytes too
        if (name, reason) not in _warned:
            _warned.add((name, reason))
            log.warning("skipping %s: %s", name, reason)
        if broken is not None:
            broken[name] = f"{path}: skipped: {reason}"
    return paths


def _not_a_definition(path: Path, entry: os.DirEntry) -> str | None:
    if entry.name.startswith("."):
        return "a hidden file (an editor's lock or backup file?); definitions are named <table>.sql"
    try:
        info = os.stat(path)            # follows a symlink: one to a regular file is a definition
    except OSError as exc:
        return f"cannot be read ({exc.strerror}: a dangling symlink?); remove it or point it at a file"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a directory, FIFO or device); remove it or rename it without .sql"
    if info.st_size > MAX_DEFINITION_BYTES:
        return f"{info.st_size} bytes, over the {MAX_DEFINITION_BYTES} a definition may have; is it a definition?"
    return None


def read_definition(path: Path) -> str:
    """The file's text, refused as the table's DefinitionError when it is no UTF-8 text of a
    bounded size. Opened non-blocking, so a FIFO swapped in after the listing cannot hang it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise DefinitionError(f"{path}: cannot be read ({exc.strerror}); fix or remove the file") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DefinitionError(f"{path}: not a regular file; remove it or rename it without .sql")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_DEFINITION_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_DEFINITION_BYTES:
        raise DefinitionError(f"{path}: over {MAX_DEFINITION_BYTES} bytes; a definition is a page of SQL")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise DefinitionError(f"{path}:{line}: byte 0x{data[exc.start]:02x} is not UTF-8; save the file as "
                              f"UTF-8") from None


def check_nesting(path: Path, text: str) -> None:
    """Refuse SQL deeper than the parser and compiler can follow, counted on its tokens (so
    parentheses inside strings and comments do not count), naming where it gets too deep."""
    import sqlglot
    from sqlglot.tokens import TokenType

    try:
        tokens = sqlglot.tokenize(text, read="spark")
    except sqlglot.errors.TokenError as exc:
        raise DefinitionError(f"{path}: SQL does not tokenize ({exc})") from None
    if len(tokens) > MAX_TOKENS:
        raise DefinitionError(f"{path}: {len(tokens)} SQL tokens, over the {MAX_TOKENS} a definition may have; "
                              f"simplify it")
    opening = {TokenType.L_PAREN, TokenType.CASE}
    closing = {TokenType.R_PAREN, TokenType.END}
    unary = {TokenType.NOT, TokenType.DASH, TokenType.PLUS}
    binary = {TokenType.PLUS, TokenType.DASH, TokenType.STAR, TokenType.SLASH, TokenType.MOD, TokenType.AND,
              TokenType.OR, TokenType.DPIPE, TokenType.EQ, TokenType.NEQ, TokenType.GT, TokenType.GTE,
              TokenType.LT, TokenType.LTE}
    depth, run, chains, previous = 0, 0, [0], None
    for token in tokens:
        if token.token_type in opening:
            depth += 1
            chains.append(0)
        elif token.token_type in closing:
            depth = max(depth - 1, 0)
            if len(chains) > 1:
                chains.pop()
        operand_expected = previous is None or previous in opening or previous in binary or previous in unary \
            or previous == TokenType.COMMA
        if token.token_type in unary and operand_expected:
            run += 1
        else:
            run = 0
            if token.token_type in binary:
                chains[-1] += 1
        if depth + run > MAX_NESTING:
            raise DefinitionError(f"{path}:{token.line}:{token.col}: parentheses, CASE and NOT nest deeper than "
                                  f"{MAX_NESTING} levels; simplify the expression")
        if chains[-1] > MAX_CHAIN:
            raise DefinitionError(f"{path}:{token.line}:{token.col}: over {MAX_CHAIN} operators in one expression "
                                  f"level; simplify it")
        previous = token.token_type
