"""Named errors of the stack's processes and the Airflow server they talk to."""
from __future__ import annotations

__all__ = ["DeployError", "NoAnswer", "ProcessExited"]


class DeployError(Exception):
    """Every named error of this layer is one: catch it to handle them all."""


class NoAnswer(DeployError, RuntimeError):
    """The server did not answer within the patience given."""


class ProcessExited(DeployError, RuntimeError):
    """A process the stack waits for died while starting: waiting longer cannot help."""
