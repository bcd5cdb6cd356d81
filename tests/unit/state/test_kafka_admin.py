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


class _Flaky:
    """A metadata client whose list_topics fails with `errors` (Kafka error names) in turn, then
    answers with one topic."""

    def __init__(self, *errors: str) -> None:
        self.errors = list(errors)
        self.calls = 0

    def list_topics(self, topic=None, timeout=None):
        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        if self.errors:
            raise KafkaException(KafkaError(getattr(KafkaError, self.errors.pop(0))))
        meta = SimpleNamespace(error=None, partitions={0: object()})
        return SimpleNamespace(topics={topic: meta})

    def poll(self, timeout=None):
        return None


def test_metadata_asks_again_while_one_of_several_brokers_restarts(monkeypatch):
    monkeypatch.setattr(kafka_admin.time, "sleep", lambda s: None)
    client = _Flaky("_TRANSPORT", "_ALL_BROKERS_DOWN")
    assert kafka_admin.topic_metadata(client, "b:1,b:2,b:3", "t") is not None
    assert client.calls == 3


@pytest.mark.parametrize(("bootstrap", "error"), [("b:1", "_TRANSPORT"), ("b:1,b:2", "_AUTHENTICATION")])
def test_a_single_broker_lost_or_a_refusal_is_said_at_once(monkeypatch, bootstrap, error):
    from state.errors import KafkaAccessError

    monkeypatch.setattr(kafka_admin.time, "sleep", lambda s: None)
    client = _Flaky(error, error)
    with pytest.raises(KafkaAccessError, match="kafka"):
        kafka_admin.topic_metadata(client, bootstrap, "t")
    assert client.calls == 1


def test_several_brokers_that_never_answer_are_said_after_the_patience(monkeypatch):
    from state.errors import KafkaAccessError

    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(kafka_admin.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(kafka_admin.time, "sleep", lambda s: None)
    client = _Flaky(*["_TRANSPORT"] * 100)
    with pytest.raises(KafkaAccessError, match="no broker answered"):
        kafka_admin.topic_metadata(client, "b:1,b:2", "t", patience=30)
    assert 2 <= client.calls <= 5


def test_a_batch_is_run_again_after_a_lost_broker_but_not_after_a_refusal():
    """The runner retries a batch only for what a lost broker causes: a Kafka error of that kind,
    raised here or reported as a Spark task's text, and a client that outwaited its patience
    (BrokerUnreachable, also as text); a refused login or ACL is raised at once."""
    from confluent_kafka import KafkaError, KafkaException

    from state import kafka_errors
    from state.errors import BrokerUnreachable, KafkaAccessError

    assert kafka_errors.broker_lost(KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))) == "NOT_COORDINATOR"
    assert kafka_errors.broker_lost(BrokerUnreachable("kafka b:1: no broker answered")) == "BrokerUnreachable"
    worker = "An exception was thrown from the Python worker.\n{}\n  File \"x.py\", line 1\n{}"
    assert kafka_errors.broker_lost(RuntimeError(worker.format("Traceback", "cimpl.KafkaException: "
                                                               "KafkaError{code=_TIMED_OUT,val=-185}"))) == "_TIMED_OUT"
    assert kafka_errors.broker_lost(RuntimeError(worker.format(
        "Traceback", "state.errors.BrokerUnreachable: kafka b:1: no broker answered"))) == "BrokerUnreachable"
    assert kafka_errors.broker_lost(KafkaAccessError("kafka b:1 refused user 'x'")) is None
    assert kafka_errors.broker_lost(RuntimeError(worker.format(
        "Traceback", "state.errors.KafkaAccessError: kafka b:1 refused user 'x'"))) is None
    assert kafka_errors.broker_lost(RuntimeError(worker.format(
        "Traceback", "cimpl.KafkaException: KafkaError{code=TOPIC_AUTHORIZATION_FAILED,val=29}"))) is None
    assert issubclass(BrokerUnreachable, KafkaAccessError)
