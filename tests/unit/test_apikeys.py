"""recallq.state.apikeys: the shape of keys, their hashes and what each role may do."""

from __future__ import annotations

import pytest

from recallq.core.redact import Redactor
from recallq.state import apikeys


def test_keys_are_long_random_and_recognisable() -> None:
    keys = {apikeys.new_key() for _ in range(1000)}
    assert len(keys) == 1000
    for key in list(keys)[:20]:
        assert key.startswith("rq_") and len(key) == 46 and apikeys.looks_like_key(key)
        assert set(key[3:]) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        )


def test_only_a_hash_is_kept_and_it_is_sha256() -> None:
    key = apikeys.new_key()
    digest = apikeys.hash_key(key)
    assert len(digest) == 64 and key not in digest
    assert digest == apikeys.hash_key(key) != apikeys.hash_key(key + "x")


@pytest.mark.parametrize(
    "token", ["", "garbage", "Bearer rq_x", "rq_" + "a" * 300, "rq_ünïcode", "sk-something"]
)
def test_tokens_that_are_no_key_of_ours_are_not_even_looked_up(token: str) -> None:
    assert not apikeys.looks_like_key(token)


def test_roles_include_the_ones_below() -> None:
    allowed = {
        role: {needed for needed in apikeys.ROLES if apikeys.Principal("k", "p", role).may(needed)}
        for role in apikeys.ROLES
    }
    assert allowed == {
        "read": {"read"},
        "write": {"read", "write"},
        "admin": {"read", "write", "admin"},
    }


@pytest.mark.parametrize("name", ["team-a", "A1", "x.y_z", "a" * 64])
def test_good_project_names(name: str) -> None:
    assert apikeys.check_project(name) == name


@pytest.mark.parametrize("name", ["", "-x", "a b", "a/b", "a" * 65, "é", "a\x00"])
def test_bad_project_names(name: str) -> None:
    with pytest.raises(apikeys.InvalidKeyRequest):
        apikeys.check_project(name)


def test_a_recallq_key_in_text_is_redacted() -> None:
    key = apikeys.new_key()
    assert key not in Redactor()(f"the client sent {key} twice")
