"""Every change recallq makes to a library's internals, in one place, applied by the runners.

Each patch is guarded (applied once, skipped when the patched name is gone), names the library
version it was checked against (pinned in pyproject.toml), and has a test that fails without
it. A library upgrade that moves an internal shows up here and in those tests, nowhere else.

- litellm (checked against 1.110.2), applied by `prepare_litellm()` where litellm is imported
  to be called: the litellm transport (recallq.judge.litellm_transport, for models that do not
  take the direct OpenAI-compatible lane: recallq.judge.lanes) and the batch lane. A process
  whose models all take the direct lane neither imports litellm nor patches it:
  - no price-map search for models litellm has no price for: about 3.5 ms of CPU per call,
    a quarter of its overhead (tests/integration/test_llm_judge.py, the pricing test);
  - no event loop per call for "service callbacks" when none is registered
    (test_calls_from_a_worker_thread_build_no_event_loop);
  - calls run as litellm's "internal sub-calls", which skip the success-callback job it
    queues on a thread pool after every call (about 0.4 ms of CPU and a thread hand-off).
- kombu (checked against 5.7.0), applied by `prepare_kombu()` when a worker starts:
  - closing a broker connection that Celery already collected is the connection error it is
    (tests/integration/test_broker.py);
  - one Redis client per channel and connection pool (`Channel._create_client`), where kombu
    built a new client for every publish and every command (about 0.2 ms of CPU each, two or
    three per item) (tests/integration/test_broker.py, the client test);
  - a broker URL without a password is shown without the `:**@` kombu puts in every URL it
    shows (`redis://:**@127.0.0.1:6379/0` for a Redis with no password, which the log
    redaction then showed as `redis://:[redacted]@...`: tests/unit/test_frictions.py).
- prometheus-client (checked against 0.26.0), by `count_in_files()` where `recallq worker
  --metrics-port` starts: its multiprocess mode, which it picks from PROMETHEUS_MULTIPROC_DIR
  when it is imported (recallq's CLI imports it before it knows the command), chosen after
  the import the way its own tests do (tests/unit/test_prometheus_files.py).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from recallq import extras

_lock = threading.Lock()
#: Model names litellm has no price for (local servers, the test stub): pricing them is skipped.
_unpriced: set[str] = set()


F = TypeVar("F", bound=Callable[..., Any])


def _ours(function: F) -> F:
    """Marks a replacement, so a second application finds it in place and stops."""
    setattr(function, "_recallq", True)  # noqa: B010
    return function


def _is_ours(function: object) -> bool:
    return bool(getattr(function, "_recallq", False))


def mark_unpriced(*names: str) -> None:
    _unpriced.update(names)


def mark_priced(*names: str) -> None:
    """Names a judge built later gives prices for (a models file read again, another test's
    models): priced again, whatever an earlier judge of the same name said."""
    _unpriced.difference_update(names)


def prepare_litellm() -> None:
    """Import litellm offline, set its globals for recallq, and patch it. Idempotent. Without
    litellm (installed by the `llm` extra), MissingExtra says how to install it."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import
    extras.require("litellm", "an LLM judge")
    import litellm

    with _lock:
        litellm.suppress_debug_info = True
        litellm.telemetry = False
        litellm.drop_params = True  # providers without json_schema get JSON mode or prompt-only
        # litellm logs several INFO lines per call (and Celery's worker echoes its handler's
        # output a second time): at this volume that is CPU spent on noise. Warnings still show.
        for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
            logging.getLogger(name).setLevel(logging.WARNING)
        _skip_pricing_of_unpriced_models()
        _skip_service_events_without_listeners()


def without_litellm_callbacks() -> AbstractContextManager[Any]:
    """Run a litellm call as an "internal sub-call": litellm then skips the logging payload it
    builds for success callbacks. recallq registers none and reads usage and cost off the
    response; pricing still happens in the caller."""
    from litellm._internal_context import internal_sub_call

    context: AbstractContextManager[Any] = internal_sub_call()
    return context


def _skip_pricing_of_unpriced_models() -> None:
    from litellm.litellm_core_utils import litellm_logging

    logging_class = litellm_logging.Logging
    original = getattr(logging_class, "response_cost_calculator", None)
    if original is None or _is_ours(original):
        return

    def response_cost_calculator(self: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
        name = kwargs.get("litellm_model_name") or getattr(self, "model", None)
        if name in _unpriced:
            return None
        return original(self, result, *args, **kwargs)

    logging_class.response_cost_calculator = _ours(response_cost_calculator)


def _skip_service_events_without_listeners() -> None:
    """litellm times every provider request and hands the timing to its "service callbacks"
    (Prometheus, Datadog, OTel). It does so through an event loop, and a worker thread has
    none, so each call built and tore down a fresh loop (a socket pair, an epoll, a dozen
    syscalls) for callbacks that recallq never registers. With none registered, skip it."""
    import litellm
    from litellm._service_logger import ServiceLogging

    original = ServiceLogging._dispatch_from_sync
    if _is_ours(original):
        return

    def dispatch_from_sync(hook: Any) -> None:
        if litellm.service_callback:
            original(hook)

    ServiceLogging._dispatch_from_sync = staticmethod(_ours(dispatch_from_sync))


def prepare_kombu() -> None:
    """When Redis goes away while messages are unacknowledged, Celery collects the broken
    connection (detaching its transport) and then closes it, and closing tries to put those
    messages back through the detached transport: an AttributeError that Celery treats as
    unrecoverable, so the worker exits (seen in about 1 of 8 Redis restarts). Raise the
    connection error it really is: Celery then reconnects as usual, and the reaper resends
    what the broker lost."""
    from kombu.transport import redis as kombu_redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    original: Any = kombu_redis.Channel._connparams
    if _is_ours(original):
        return

    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            raise RedisConnectionError("the broker connection is already closed")
        return original(self, asynchronous)

    setattr(kombu_redis.Channel, "_connparams", _ours(_connparams))  # noqa: B010  (a method)
    _one_client_per_pool(kombu_redis.Channel)
    _no_password_mask_without_a_password()


def _no_password_mask_without_a_password() -> None:
    """kombu's Connection.as_uri() (the worker's banner and its "Connected to" line) puts a
    masked password in every URL it shows, one or not: with no password there is nothing to
    hide, so the URL is shown as it is."""
    from kombu.connection import Connection

    original: Any = Connection.as_uri
    if _is_ours(original):
        return

    def as_uri(self: Any, include_password: bool = False, *args: Any, **kwargs: Any) -> Any:
        if not include_password and not self.password:
            include_password = True  # none to include: the URL as given
        return original(self, include_password, *args, **kwargs)

    setattr(Connection, "as_uri", _ours(as_uri))  # noqa: B010  (a method)


def _one_client_per_pool(channel_class: Any) -> None:
    """kombu's Redis channel makes a `redis.Redis` client for each publish and each command it
    sends (`conn_or_acquire()` without a client), on the channel's one connection pool; making
    one parses its options anew each time. A client holds no connection of its own (it takes
    one from the pool per command, so threads may share it): keep one per channel for as long
    as the channel keeps its pool. A pool dropped after a broken connection
    (`_disconnect_pools`) gets a client of its own."""
    original: Any = channel_class._create_client
    if _is_ours(original):
        return

    def _create_client(self: Any, asynchronous: bool = False) -> Any:
        if asynchronous:  # the consumer's own client, made once per channel by kombu already
            return original(self, asynchronous)
        pool = self.pool
        kept = self.__dict__.get("_recallq_client")
        if kept is not None and kept[0] is pool:
            return kept[1]
        client = original(self, False)
        self.__dict__["_recallq_client"] = (pool, client)
        return client

    setattr(channel_class, "_create_client", _ours(_create_client))  # noqa: B010  (a method)


def count_in_files(directory: str) -> None:
    """Metrics made from now on in this process and the processes it forks count in files in
    `directory` (prometheus-client's multiprocess mode), whatever values made before did."""
    from prometheus_client import values

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # where each process's files go
    with _lock:
        if not getattr(values.ValueClass, "_multiprocess", False):
            values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
