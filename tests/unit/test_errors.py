"""Every exception Tether raises on purpose is a TetherError, and each serialization failure
says which side failed while one ``except SerializationError`` still catches both."""

from __future__ import annotations

import pickle

import pytest

import tether
from tether import (
    ArgumentSerializationError,
    EnqueueError,
    InvalidArguments,
    ResultSerializationError,
    SerializationError,
    TaskTimeout,
    TetherError,
)
from tether.contrib.taskiq import DeliveryLost
from tether.contrib.taskiq._wire import NotTaskiq
from tether.protocol._envelope import BadEnvelope
from tether.worker._outcome import error_fields


@pytest.mark.parametrize("error", [BadEnvelope, DeliveryLost, NotTaskiq, TaskTimeout])
def test_internal_and_worker_errors_are_tether_errors(error: type[Exception]) -> None:
    assert issubclass(error, TetherError)


def test_an_unencodable_argument_is_an_enqueue_error_and_a_serialization_error() -> None:
    assert issubclass(ArgumentSerializationError, EnqueueError)
    assert issubclass(ArgumentSerializationError, SerializationError)
    assert issubclass(ArgumentSerializationError, TypeError)  # as SerializationError was


def test_invalid_arguments_are_an_enqueue_error_caught_apart_from_the_server_failing() -> None:
    """A web view answers ``InvalidArguments`` with a 422 and any other ``EnqueueError`` with
    a 503; code that catches ``EnqueueError`` catches both, as before."""
    assert issubclass(InvalidArguments, EnqueueError)
    assert issubclass(InvalidArguments, TypeError)  # as a wrong call of the function is
    assert issubclass(ArgumentSerializationError, InvalidArguments)
    assert ArgumentSerializationError.__mro__.index(SerializationError) < (
        ArgumentSerializationError.__mro__.index(InvalidArguments)
    )
    assert InvalidArguments.__module__ == "tether"  # recorded by its public name


def test_an_unencodable_result_is_a_serialization_error_but_no_enqueue_error() -> None:
    assert issubclass(ResultSerializationError, SerializationError)
    assert not issubclass(ResultSerializationError, EnqueueError)


@pytest.mark.parametrize(
    ("error", "recorded"),
    [
        (TaskTimeout("ran past its timeout of 1.0s"), "tether.TaskTimeout"),
        (ResultSerializationError("the result (object)"), "tether.ResultSerializationError"),
    ],
)
def test_errors_a_worker_records_are_recorded_by_their_public_name(
    error: Exception, recorded: str
) -> None:
    """Results, dead letters and statistics name them as users import them, not by the
    private module that defines them; the traceback says the same."""
    fields = error_fields(error)
    assert fields["type"] == recorded
    assert fields["traceback"].startswith(f"{recorded}: ")
    assert getattr(tether, recorded.removeprefix("tether.")) is type(error)
    assert type(pickle.loads(pickle.dumps(error))) is type(error)


def test_a_timeout_is_a_timeout_error_that_remembers_a_kept_slot() -> None:
    error = TaskTimeout("ran past its timeout")
    assert isinstance(error, TimeoutError)
    assert error.slot_kept is False
    error.slot_kept = True
    assert TaskTimeout("another").slot_kept is False


def test_the_public_errors_are_exported() -> None:
    names = ("ArgumentSerializationError", "InvalidArguments", "ResultSerializationError")
    for name in (*names, "TaskTimeout"):
        assert name in tether.__all__
