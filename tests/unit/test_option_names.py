"""option_names.guess: the nearest known name, or this app's name for a Celery option."""

from __future__ import annotations

import pytest

from django_reliable_executor import executor, reliable_task_handler
from django_reliable_executor.core.option_names import guess
from django_reliable_executor.exceptions import HandlerRegistrationError, InvalidTaskOptionError

KNOWN = ["delay_millis", "retry_limit", "retry_on", "run_at"]


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("retry_limt", " (did you mean 'retry_limit'?)"),
        ("countdown", " (Celery's countdown is 'delay_millis' here: milliseconds, not seconds)"),
        ("eta", " (Celery's eta is 'run_at' here: an aware datetime)"),
        ("max_retries", " (Celery's max_retries is 'retry_limit' here)"),
        ("RETRY_LIMIT", " (did you mean 'retry_limit'?)"),
        ("delay", " (did you mean 'delay_millis'? milliseconds)"),
        ("retries", " (did you mean 'retry_limit'? retries after the first attempt)"),
        ("xyzzy", ""),
        (3, ""),
    ],
)
def test_guess(name, said):
    assert guess(name, KNOWN) == said


def test_an_unknown_submit_option_says_what_it_probably_meant():
    with pytest.raises(InvalidTaskOptionError) as caught:
        executor.submit("demo.echo", 1, countdown=5, retry_limt=2)
    assert str(caught.value) == (
        "unknown submit option(s): countdown (Celery's countdown is 'delay_millis' here: "
        "milliseconds, not seconds), retry_limt (did you mean 'retry_limit'?)"
    )


def test_a_decorator_option_given_to_submit_says_where_it_belongs():
    with pytest.raises(InvalidTaskOptionError) as caught:
        executor.submit("demo.echo", 1, autoretry_for=(ValueError,))
    assert "(Celery's autoretry_for is the decorator's 'retry_on' here" in str(caught.value)


def test_an_unknown_decorator_option_says_what_it_probably_meant():
    with pytest.raises(HandlerRegistrationError) as caught:

        @reliable_task_handler(name="tests.celery_habits", autoretry_for=(ValueError,))
        def handler() -> None: ...

    assert "autoretry_for (Celery's autoretry_for is 'retry_on' here" in str(caught.value)
