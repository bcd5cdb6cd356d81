"""Named errors of the catalog (definitions, the batch log, locks): each says which table, what is wrong and the fix."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlglot import exp

__all__ = ["CatalogError", "DefinitionError", "LockTimeout", "UnsupportedSql", "UserError"]


class CatalogError(Exception):
    """Every named error of this layer is one: catch it to handle them all."""


class UserError(CatalogError, ValueError):
    """A request the user can fix (an option, a table name, a batch), as opposed to a failure of
    the work: the CLI exits 2 for these, 1 for the others."""


class DefinitionError(CatalogError, ValueError):
    """A table definition the product cannot run; the message says where and how to fix it."""


class LockTimeout(CatalogError, RuntimeError):
    """Another job held the table's lock for longer than this one may wait."""


class UnsupportedSql(CatalogError, ValueError):
    """A construct outside SUPPORTED; `node` is where it is."""

    def __init__(self, node: exp.Expression, what: str) -> None:
        super().__init__(what)
        self.node = node
