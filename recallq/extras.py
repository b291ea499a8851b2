"""The parts of recallq that `pip install recallq` leaves out, and the one line that says which
extra brings a missing one.

    pip install recallq               local mode with the offline judge, files, reports, and the
                                      client commands of a service (recallq.Client)
    pip install "recallq[llm]"        LLM judges (litellm): `recallq run FILE --model M`
    pip install "recallq[service]"    the API, the workers, Postgres and Redis (and [llm])

pyproject.toml's optional dependencies are the lists; this module only names, for each library
of an extra, the extra that installs it.
"""

from __future__ import annotations

from importlib.util import find_spec

#: The top-level module of each library of an extra, and that extra.
EXTRA_OF = {
    "litellm": "llm",
    "openai": "llm",
    "celery": "service",
    "kombu": "service",
    "redis": "service",
    "psycopg": "service",
    "fastapi": "service",
    "starlette": "service",
    "uvicorn": "service",
}


class MissingExtra(ModuleNotFoundError):
    """A library of an extra is not installed; the message says which extra installs it."""


def installed(module: str) -> bool:
    return find_spec(module) is not None


def install_line(module: str, needed_for: str) -> str:
    """The one line for a library of an extra that is not installed."""
    extra = EXTRA_OF[module]
    return f'{needed_for} needs {module}, which is not installed: pip install "recallq[{extra}]"'


def require(module: str, needed_for: str) -> None:
    """Raise MissingExtra (one line) unless `module`, a library of an extra, is installed."""
    if not installed(module):
        raise MissingExtra(install_line(module, needed_for), name=module)


def hint(exc: ModuleNotFoundError, needed_for: str = "this command") -> str | None:
    """The one line for an import that failed because an extra is not installed; None when
    the module is not one of an extra (a broken install, a bug: not a user's to fix)."""
    if isinstance(exc, MissingExtra):
        return str(exc)
    module = (exc.name or "").partition(".")[0]
    if module not in EXTRA_OF or installed(module):
        return None
    return install_line(module, needed_for)
