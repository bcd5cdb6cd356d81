"""Errors as users read them: one line, in the words of the code that raised it.

Every surface that shows an error (the CLI, a drill's record on the State tables page, a
task's summary) goes through here, so none of them shows a Python class name for a condition
statetable describes itself, or a JVM stack where one line says it.
"""
from __future__ import annotations

OUR_PACKAGES = ("catalog", "state", "spark_jobs", "serving", "ops", "deploy", "statetable_airflow")


def one_line(exc: BaseException) -> str:
    """An error's own first line (a Spark error's JVM stack and a definition's caret display stay
    out), prefixed with its type unless it is one of ours that speaks for itself."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    if (inner := task_error(str(exc))) is not None:
        return inner
    ours = type(exc).__module__.split(".")[0] in OUR_PACKAGES or raised_by_us(exc)
    return text if ours and text else f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def task_error(text: str) -> str | None:
    """The sentence of one of our errors that a Spark task raised, from the traceback text Spark
    wraps it in (`spark_jobs.steps.schemas.RegistryUnreachable: the schema registry at ...`):
    its first line is Spark's, about a Python worker, and tells the user nothing."""
    import re

    found = re.findall(rf"^(?:{'|'.join(OUR_PACKAGES)})\.[\w.]+?\.\w+: (.+)$", text, flags=re.M)
    return found[-1].strip() if found and "Traceback" in text else None


def raised_by_us(exc: BaseException) -> bool:
    """Whether the innermost frame that raised `exc` is statetable's own code: a ValueError we
    raise with a sentence for the user is shown as that sentence, a library's as its type too."""
    import os

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    path = tb.tb_frame.f_code.co_filename
    parts = path.split(os.sep)
    return "site-packages" not in parts and any(p in OUR_PACKAGES for p in parts[-3:-1])


