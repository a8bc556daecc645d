"""A key taken from a task call: the value of one of its arguments (as a string), or what a
callable of the call's ``(args, kwargs)`` returns. Unique tasks key their idempotency claims
with one (``sluice.tasks.unique``) and per-key concurrency limits their counts
(``sluice.tasks.limits``); both check it the same way, at declaration and at the call."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sluice.errors import ConfigurationError

#: The longest key (a longer one is a value, not a key).
MAX_KEY_LENGTH = 256

#: A call's key: the name of one of the task's arguments, or a callable of ``(args, kwargs)``.
CallKey = str | Callable[[Sequence[Any], Mapping[str, Any]], str]


def check_key(key: object, where: str, what: str = "key") -> str:
    """``key`` if it is usable (a non-empty string of at most 256 characters)."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise ConfigurationError(
            f"{where}: {what} {key!r} must be a non-empty string of at most {MAX_KEY_LENGTH} "
            'characters (e.g. "order-42"); build one from the call\'s values with str()'
        )
    return key


def check_call_key(key: object, what: str) -> None:
    """At construction: ``key`` names an argument (an identifier) or is a callable."""
    if not (isinstance(key, str) and key.isidentifier()) and not callable(key):
        raise ConfigurationError(
            f"{what}(key={key!r}) must name an argument of the task or be a callable of (args, kwargs)"
        )


def check_argument(key: CallKey, fun: Callable[..., Any], name: str, bound: bool, what: str) -> None:
    """At declaration: a key that names no argument of ``fun`` is an error naming the arguments."""
    if not isinstance(key, str):
        return
    params = list(inspect.signature(fun).parameters)[1 if bound else 0 :]
    if key not in params:
        raise ConfigurationError(
            f"{name}: {what}(key={key!r}) names no argument of the task; its arguments: {', '.join(params)}"
        )


def call_key(
    key: CallKey, fun: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], what: str = "key"
) -> str:
    """The key of one call of ``fun`` (a bound task's ``run``, whose signature has no self)."""
    if callable(key):
        return check_key(key(args, kwargs), "key=...", what)
    if key in kwargs:
        return check_key(str(kwargs[key]), key, what)
    params = list(inspect.signature(fun).parameters)
    index = params.index(key)
    if index >= len(args):
        raise ConfigurationError(f"the call has no value for {key!r}, the task's {what} argument")
    return check_key(str(args[index]), key, what)
