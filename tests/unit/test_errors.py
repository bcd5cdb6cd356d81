"""One error root: every error statetable raises on purpose is a StatetableError, rooted in its
layer's base, never in another layer's class; a mistake the user can fix is UserFixable (the CLI
exits 2 for it). tests/test_layout.py holds that no product code raises a bare builtin."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

import pytest

from state.errors import StatetableError, UserFixable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins"))          # the provider's package, as Airflow loads it

BASES = {"state": ("state.errors", "StateError"), "catalog": ("catalog.errors", "CatalogError"),
         "spark_jobs": ("spark_jobs.errors", "JobError"), "ops": ("ops.errors", "OpsError"),
         "serving": ("serving.errors", "ServingError"), "statetable_airflow": ("statetable_airflow.errors", "ProviderError"),
         "deploy": ("deploy.errors", "DeployError")}
FOLDERS = {"statetable_airflow": ROOT / "plugins" / "statetable_airflow"}



def _modules(layer: str):
    package = importlib.import_module(layer)
    for info in pkgutil.walk_packages(package.__path__, f"{layer}."):
        yield importlib.import_module(info.name)


def _errors_defined_in(layer: str) -> list[type]:
    return [obj for module in _modules(layer) for _, obj in inspect.getmembers(module, inspect.isclass)
            if issubclass(obj, BaseException) and obj.__module__ == module.__name__]


def _base(layer: str) -> type:
    module, name = BASES[layer]
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("layer", sorted(BASES))
def test_every_error_of_a_layer_is_rooted_in_its_base_and_in_statetable_error(layer):
    errors = [e for e in _errors_defined_in(layer) if e not in (StatetableError, UserFixable)]
    assert errors, f"{layer}: no named errors found (the walk must see them)"
    base = _base(layer)
    assert issubclass(base, StatetableError) and base.__bases__ == (StatetableError,)
    assert [e.__qualname__ for e in errors if e is not base and not issubclass(e, base)] == []


def test_no_error_inherits_from_another_layers_class():
    """Only the root and the UserFixable marker cross layers: a class of ops under a class of
    catalog made catalog's `except` catch ops' errors."""
    home = {}
    for layer in BASES:
        for error in _errors_defined_in(layer):
            if error not in (StatetableError, UserFixable):
                home[error] = layer
    crossing = [f"{error.__module__}.{error.__qualname__} <- {parent.__module__}.{parent.__qualname__}"
                for error, layer in home.items() for parent in error.__mro__[1:]
                if parent in home and home[parent] != layer]
    assert crossing == []


def test_except_statetable_error_catches_every_error_the_product_defines():
    for layer in BASES:
        for error in _errors_defined_in(layer):
            assert issubclass(error, StatetableError), error


def test_one_name_one_error():
    """Two unrelated classes of one name made `except Unsupported` catch the wrong one."""
    names: dict[str, list[str]] = {}
    for layer in BASES:
        for error in _errors_defined_in(layer):
            names.setdefault(error.__name__, []).append(error.__module__)
    assert {n: m for n, m in names.items() if len(set(m)) > 1} == {}


def test_user_mistakes_of_every_layer_are_user_fixable():
    from catalog.errors import DefinitionError, UserError
    from ops.errors import NothingToInject
    from serving.errors import BadQuery, NoSuchTable
    from spark_jobs.errors import RollbackRefused, TopicMissing
    from state.errors import BadSetting

    for error in (DefinitionError, UserError, NothingToInject, BadQuery, NoSuchTable, RollbackRefused, TopicMissing,
                  BadSetting):
        assert issubclass(error, UserFixable), error
    from deploy.errors import NoAnswer
    from spark_jobs.errors import EngineUnavailable

    assert not issubclass(NoAnswer, UserFixable) and not issubclass(EngineUnavailable, UserFixable)


def test_the_cli_exits_2_for_a_user_fixable_error_and_1_for_another(monkeypatch, capsys):
    from deploy import cli
    from spark_jobs.errors import MirrorUnstable, TopicMissing

    def failing(error):
        def command(_args):
            raise error
        return command

    for error, code in ((TopicMissing("table 't': its topic 'x' does not exist"), cli.EXIT_USAGE),
                        (MirrorUnstable("t: the mirror folded 3 times"), cli.EXIT_FAILED)):
        monkeypatch.setattr(cli, "_tables", failing(error))         # bound when the parser is built
        assert cli.main(["tables"]) == code
        assert str(error) in capsys.readouterr().err
