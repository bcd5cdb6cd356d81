"""Named errors of the stack's processes and the Airflow server they talk to."""
from __future__ import annotations

from state.errors import StatetableError, UserFixable

__all__ = ["AirflowRefused", "CommandFailed", "DeployError", "HostUnsuitable", "NoAnswer", "PortTaken", "ProcessExited",
           "RunFailed", "UnexpectedOutput", "WaitTimedOut"]


class DeployError(StatetableError):
    """Every named error of this layer is one: catch it to handle them all."""


class NoAnswer(DeployError, RuntimeError):
    """The server did not answer within the patience given."""


class ProcessExited(DeployError, RuntimeError):
    """A process the stack waits for died while starting: waiting longer cannot help."""


class WaitTimedOut(DeployError, TimeoutError):
    """What a command waited for (a port, a state, a DAG run) was not reached in time."""


class AirflowRefused(DeployError, RuntimeError):
    """Airflow's REST API answered with an error."""


class UnexpectedOutput(DeployError, ValueError):
    """A tool printed something other than what the stack reads from it."""


class CommandFailed(DeployError, RuntimeError):
    """A command the stack runs (initdb, kafka-storage, openssl) exited with an error."""


class HostUnsuitable(DeployError, RuntimeError):
    """This host cannot run a part of the stack as it is (the message says why)."""


class PortTaken(DeployError, UserFixable, RuntimeError):
    """A port the stack needs is held by another process."""


class RunFailed(DeployError, RuntimeError):
    """A DAG run the command waited for ended in failure."""


class CdcUnavailable(DeployError, UserFixable, RuntimeError):
    """The stack cannot run its CDC pipeline as it stands (a PostgreSQL made before CDC)."""
