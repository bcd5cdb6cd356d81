"""Pure logic of state.kafka_admin's replication check, with a stand-in admin client: the
answers a real broker gives are in tests/test_secure_kafka.py and tests/test_kafka_topics.py."""
from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace

import pytest

from state import kafka_admin


class _Admin:
    """An AdminClient whose describe_configs answers with `outcome` (a value or an exception)."""

    def __init__(self, brokers: int, outcome) -> None:
        self.brokers = {b: object() for b in range(1, brokers + 1)}
        self.outcome = outcome

    def list_topics(self, timeout=None):
        return SimpleNamespace(brokers=self.brokers, topics={})

    def describe_configs(self, resources):
        future = concurrent.futures.Future()
        if isinstance(self.outcome, BaseException):
            future.set_exception(self.outcome)
        else:
            future.set_result({"default.replication.factor": SimpleNamespace(value=str(self.outcome))})
        return {resources[0]: future}


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setattr(kafka_admin, "_WANTED", {})
    monkeypatch.delenv(kafka_admin.REPLICATION_ENV, raising=False)


def test_the_brokers_default_is_what_statetable_asks_for():
    assert kafka_admin.wanted_replication(_Admin(3, 2), bootstrap="b:1") == 2


@pytest.mark.parametrize("error", [concurrent.futures.TimeoutError(), TimeoutError()])
def test_a_broker_that_dies_while_asked_gives_the_convention_not_an_error(error):
    """The secure stack's broker kills found this: describe_configs' future timed out when the
    broker asked had just died, and the TimeoutError stopped a batch's snapshot."""
    assert kafka_admin.wanted_replication(_Admin(3, error), bootstrap="b:1") == 3
    assert kafka_admin.wanted_replication(_Admin(1, error), bootstrap="b:2") == 1
