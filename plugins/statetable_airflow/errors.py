"""Named errors of the Airflow provider: a task fails with one of these, its message in the log."""
from __future__ import annotations

from state.errors import StatetableError, UserFixable

__all__ = ["ConnectionMisconfigured", "DrillNotExact", "JobFailed", "JobLeftNoResult", "ProviderError", "SmokeFailed", "AssetUnknown"]


class ProviderError(StatetableError):
    """Every named error of this layer is one: catch it to handle them all."""


class ConnectionMisconfigured(ProviderError, UserFixable, ValueError):
    """An Airflow connection the provider reads lacks a field or disagrees with statetable's settings."""


class JobFailed(ProviderError, RuntimeError):
    """A job the task ran exited non-zero."""


class JobLeftNoResult(ProviderError, FileNotFoundError):
    """A job exited without writing the result the next task reads."""


class SmokeFailed(ProviderError, ValueError):
    """The smoke DAG read other records than it planned."""


class DrillNotExact(ProviderError, RuntimeError):
    """A restore-verify drill failed, or the restored table differs from its recomputation."""


class AssetUnknown(ProviderError, LookupError):
    """A run's outlet is not an Asset Airflow knows (its DAG not parsed yet, or renamed)."""
