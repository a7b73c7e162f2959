"""exceptions: the submit errors' hierarchy."""

from __future__ import annotations

from django_reliable_executor.exceptions import (
    HandlerRegistrationError,
    InvalidParameterError,
    InvalidTaskIdError,
    InvalidTaskOptionError,
    ParameterTooLargeError,
    ReliableExecutorError,
    TaskSubmitError,
    UnknownTaskError,
)


def test_every_submit_error_is_a_task_submit_error_and_a_value_error():
    for error in (
        InvalidTaskIdError,
        UnknownTaskError,
        InvalidParameterError,
        ParameterTooLargeError,
        InvalidTaskOptionError,
    ):
        assert issubclass(error, TaskSubmitError)
        assert issubclass(error, ValueError)
        assert issubclass(error, ReliableExecutorError)
    assert issubclass(ParameterTooLargeError, InvalidParameterError)
    assert not issubclass(HandlerRegistrationError, TaskSubmitError)
    assert TaskSubmitError("m", field="task_id").field == "task_id"
