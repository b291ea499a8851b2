"""The optional parts of recallq (recallq.extras): the one line that names the extra of a
library that is not installed, kept in step with pyproject.toml and the Docker image."""

from __future__ import annotations

import contextlib
import io
import re
import tomllib

import pytest

from recallq import extras
from recallq.cli import explain
from tests.services import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
MISSING = "recallq_no_such_library"


def _import_failure(name: str) -> ModuleNotFoundError:
    try:
        __import__(name)
    except ModuleNotFoundError as exc:
        return exc
    raise AssertionError(f"{name} is importable")


def test_a_library_of_an_extra_that_is_not_installed_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(extras.EXTRA_OF, MISSING, "service")
    line = explain(_import_failure(f"{MISSING}.app"), command="worker")
    assert line == (
        f'`recallq worker` needs {MISSING}, which is not installed: pip install "recallq[service]"'
    )


def test_a_missing_module_of_no_extra_is_an_unexpected_error() -> None:
    assert explain(_import_failure(MISSING), command="run") is None


def test_an_installed_library_that_misses_a_part_is_not_blamed_on_its_extra() -> None:
    # litellm is installed here (the test extra has every extra): a broken install, a bug
    assert extras.installed("litellm")
    assert explain(_import_failure("litellm.no_such_part"), command="run") is None


def test_require_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(extras.EXTRA_OF, MISSING, "llm")
    with pytest.raises(extras.MissingExtra) as caught:
        extras.require(MISSING, "the judge gpt-4o-mini")
    assert str(caught.value) == (
        f'the judge gpt-4o-mini needs {MISSING}, which is not installed: pip install "recallq[llm]"'
    )
    assert explain(caught.value) == str(caught.value)
    extras.require("sqlalchemy", "anything")  # installed: nothing to say


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=;, ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_every_library_of_an_extra_is_named_with_that_extra() -> None:
    optional = PROJECT["optional-dependencies"]
    for extra in ("llm", "service"):
        for name in _names(optional[extra]) - {"recallq"}:
            assert extras.EXTRA_OF.get(name) == extra, f"recallq.extras.EXTRA_OF[{name!r}]"
    assert set(extras.EXTRA_OF.values()) <= set(optional)
    # a library of an extra is never a dependency of `pip install recallq` too
    assert not _names(PROJECT["dependencies"]) & set(extras.EXTRA_OF)


def test_the_docker_image_installs_the_service_and_the_llm_judges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The image runs the API, the workers and migrations: the Dockerfile's requirements are
    recallq's own and those of both extras."""
    dockerfile = (REPO / "Dockerfile").read_text()
    script = re.search(r'RUN python -c "(.+?)" > /tmp/requirements.txt', dockerfile)
    assert script, "the Dockerfile's requirements step"
    monkeypatch.chdir(REPO)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(script.group(1))  # the image's own step, as `python -c` runs it
    listed = printed.getvalue().split()
    optional = PROJECT["optional-dependencies"]
    expected = PROJECT["dependencies"] + optional["service"] + optional["llm"]
    assert sorted(listed) == sorted(r.replace(" ", "") for r in expected if "recallq" not in r)
