"""Every named error of a layer is rooted in that layer's base, so a caller can catch one layer's
errors without knowing each class, and a user's mistake (a UserError) exits 2 from the CLI."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

BASES = {"state": ("state.errors", "StateError"), "catalog": ("catalog.errors", "CatalogError"),
         "spark_jobs": ("spark_jobs.errors", "JobError"), "ops": ("ops.errors", "OpsError"),
         "serving": ("serving.errors", "ServingError"), "deploy": ("deploy.errors", "DeployError")}


def _errors_defined_in(layer: str) -> list[type]:
    package = importlib.import_module(layer)
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{layer}.{info.name}")
        found += [obj for _, obj in inspect.getmembers(module, inspect.isclass)
                  if issubclass(obj, BaseException) and obj.__module__ == module.__name__
                  and not obj.__name__.startswith("_")]
    return found


@pytest.mark.parametrize("layer", sorted(BASES))
def test_every_named_error_of_a_layer_is_rooted_in_its_base(layer):
    module, name = BASES[layer]
    base = getattr(importlib.import_module(module), name)
    errors = _errors_defined_in(layer)
    assert errors, f"{layer}: no named errors found (the walk must see them)"
    assert [e.__qualname__ for e in errors if not issubclass(e, base)] == []


def test_one_name_one_error():
    """Two unrelated classes of one name made `except Unsupported` catch the wrong one."""
    names: dict[str, list[str]] = {}
    for layer in BASES:
        for error in _errors_defined_in(layer):
            names.setdefault(error.__name__, []).append(error.__module__)
    assert {n: m for n, m in names.items() if len(set(m)) > 1} == {}


def test_user_mistakes_of_every_layer_are_user_errors():
    from catalog.errors import UserError
    from ops.errors import TopicMissing
    from spark_jobs.errors import RollbackRefused

    assert issubclass(TopicMissing, UserError) and issubclass(RollbackRefused, UserError)
