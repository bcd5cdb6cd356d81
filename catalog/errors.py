"""Named errors of the catalog (definitions, the batch log, locks): each says which table, what is wrong and the fix."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlglot import exp

from state.errors import StatetableError, UserFixable

__all__ = ["BatchLogIncomplete", "BatchLogWriteFailed", "CatalogError", "DefinitionError", "LockTimeout", "NotInstalled",
           "UnsupportedSql", "UserError"]


class CatalogError(StatetableError):
    """Every named error of this layer is one: catch it to handle them all."""


class UserError(CatalogError, UserFixable, ValueError):
    """A request the user can fix (an option, a table name, a batch), as opposed to a failure of
    the work: the CLI exits 2 for these, 1 for the others."""


class DefinitionError(CatalogError, UserFixable, ValueError):
    """A table definition the product cannot run; the message says where and how to fix it."""


class LockTimeout(CatalogError, RuntimeError):
    """Another job held the table's lock for longer than this one may wait."""


class NotInstalled(CatalogError, UserFixable, RuntimeError):
    """A part `make setup` installs is missing (jars, PostgreSQL's binaries)."""


class BatchLogWriteFailed(CatalogError, OSError):
    """The store did not take every entry of a batch log write."""


class BatchLogIncomplete(CatalogError, FileNotFoundError):
    """An entry the batch log's head or commits need is missing from the store."""


class UnsupportedSql(CatalogError, UserFixable, ValueError):
    """A construct outside SUPPORTED; `node` is where it is."""

    def __init__(self, node: exp.Expression, what: str) -> None:
        super().__init__(what)
        self.node = node
