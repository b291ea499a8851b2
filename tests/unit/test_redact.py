"""Secrets are taken out of error text before it is stored, exported or logged."""

from __future__ import annotations

import pytest

from recallq.core.redact import REDACTED, Redactor, redact_url

redact = Redactor()

# Shaped like the real thing, made up for these tests.
OPENAI = "sk-" + "A1b2C3d4E5f6G7h8I9j0" * 2 + "T3BlbkFJ"
OPENAI_PROJECT = "sk-proj-" + "Xy9_Zw8-Vu7" * 10
ANTHROPIC = "sk-ant-api03-" + "q1W2e3R4t5Y6u7I8o9P0" * 4 + "-AbCdEfAA"
AWS = "AKIAIOSFODNN7EXAMPLE"
GOOGLE = "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6q"  # 4 + 35 characters
GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0" * 2
SLACK = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)


@pytest.mark.parametrize(
    "key",
    [OPENAI, OPENAI_PROJECT, ANTHROPIC, AWS, GOOGLE, GITHUB, SLACK, JWT],
    ids=["openai", "openai-project", "anthropic", "aws", "google", "github", "slack", "jwt"],
)
def test_well_known_key_formats_are_taken_out_whole(key: str) -> None:
    text = f"Error code: 401 - invalid key {key}, check your settings"
    assert redact(text) == f"Error code: 401 - invalid key {REDACTED}, check your settings"


def test_a_half_masked_key_quoted_by_the_provider_goes_too() -> None:
    text = "Incorrect API key provided: sk-proj-********************************abcd."
    assert redact(text) == f"Incorrect API key provided: {REDACTED}."


def test_a_configured_secret_inside_a_longer_message() -> None:
    secret = "local-gateway-key-7f3a9c"  # no well-known shape: only configuration knows it
    text = f"upstream said: request {{'key': '{secret}'}} denied;retry with{secret}later"
    assert secret not in Redactor([secret])(text)
    assert Redactor([secret])(text) == (
        f"upstream said: request {{'key': '{REDACTED}'}} denied;retry with{REDACTED}later"
    )


def test_the_longest_configured_secret_wins_and_short_values_are_ignored() -> None:
    redactor = Redactor(["gateway-key", "gateway-key-2024-prod", "abc", "", "  padded-key-value\n"])
    assert redactor("k=gateway-key-2024-prod!") == f"k={REDACTED}!"
    assert redactor("gateway-key and padded-key-value") == f"{REDACTED} and {REDACTED}"
    assert redactor("abc is too short to be a key") == "abc is too short to be a key"


def test_bearer_tokens_and_authorization_headers() -> None:
    assert redact("sent Bearer abc123.def-456_ghi") == f"sent Bearer {REDACTED}"
    assert redact("Authorization: Basic dXNlcjpwYXNz\r\nHost: x") == (
        f"Authorization: {REDACTED}\r\nHost: x"
    )
    echoed = "{'Authorization': 'Bearer opaque-token-9', 'Content-Type': 'application/json'}"
    assert redact(echoed) == (
        f"{{'Authorization': '{REDACTED}', 'Content-Type': 'application/json'}}"
    )
    escaped = r"{\"authorization\": \"Token 8f7e6d5c\"}"
    assert redact(escaped) == rf"{{\"authorization\": \"{REDACTED}\"}}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("api_key=abc123xyz&model=gpt", f"api_key={REDACTED}&model=gpt"),
        ('{"api_key": "not-a-known-shape"}', f'{{"api_key": "{REDACTED}"}}'),
        ("OPENAI_API_KEY=whatever-it-is", f"OPENAI_API_KEY={REDACTED}"),
        ("headers x-api-key: k9k9k9k9 sent", f"headers x-api-key: {REDACTED} sent"),
        (
            "client_secret='s3cr3t' password=hunter22",
            f"client_secret='{REDACTED}' password={REDACTED}",
        ),
    ],
)
def test_assignments_of_secret_names(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_url_passwords() -> None:
    text = "could not connect to redis://:pw0rd@cache:6379/0 or postgresql://app:p@ss@db/x"
    assert redact(text) == (
        f"could not connect to redis://:{REDACTED}@cache:6379/0 or postgresql://app:{REDACTED}@db/x"
    )
    assert redact("see http://host:8080/path and mail ops@example.com") == (
        "see http://host:8080/path and mail ops@example.com"
    )


def test_redact_url() -> None:
    assert redact_url("postgresql+psycopg://user:secret@host/db") == (
        "postgresql+psycopg://user:***@host/db"
    )
    assert redact_url("redis://:secret@127.0.0.1:6379/2") == "redis://:***@127.0.0.1:6379/2"
    assert redact_url("postgresql://u@h/db?sslmode=require&password=x1") == (
        "postgresql://u@h/db?sslmode=require&password=***"
    )
    assert redact_url("postgresql://h/db?db_password=x1#f") == "postgresql://h/db?db_password=***#f"
    assert redact_url("sqlite:///recallq.db") == "sqlite:///recallq.db"


ORDINARY = [
    "The Eiffel Tower was completed in 1889 and is 330 metres tall.",
    "The task-force met on 2024-03-01; sk- alone is not a key, nor is sk-learn.",
    "The bearer of the bond was paid. Bearer instruments. Authorization is a board matter.",
    "A risk-adjusted-return-on-capital-model and a desk-level-value-at-risk-limit.",
    "The password policy requires 12 characters.",
    "See https://example.com/docs?page=2#section and email help@example.com.",
    "Error code: 503 - {'error': {'message': 'The server is overloaded', 'type': 'server'}}",
    "tokens=1200 max_tokens: 512, id=42, eyJ is not a JWT",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_untouched(text: str) -> None:
    assert redact(text) == text


def test_redaction_is_idempotent() -> None:
    redactor = Redactor(["local-gateway-key-7f3a9c", "redacted"])
    messages = [
        f"Authorization: Bearer {OPENAI}\nnext",
        f"{{'api_key': '{GOOGLE}', \"password\": \"x y\"}} Bearer {JWT}",
        "postgresql://app:p@ss@db/x and local-gateway-key-7f3a9c",
        *ORDINARY,
    ]
    for message in messages:
        once = redactor(message)
        assert redactor(once) == once


def test_it_never_raises() -> None:
    assert redact(None) == "None"
    assert REDACTED in redact(f"{OPENAI}".encode())
    assert redact_url(None) == "***"  # type: ignore[arg-type]
    Redactor([None, 42, "ok-secret-value"])  # type: ignore[list-item]


def test_it_is_linear() -> None:
    """(How fast: `python -m bench --sections bounds`.)"""
    redactor = Redactor([f"configured-secret-{n:04d}" for n in range(20)])
    message = (
        "litellm.ServiceUnavailableError: OpenAIException - Error code: 503 - "
        "{'error': {'message': 'upstream connect error', 'type': 'server_error'}}"
    )
    assert "configured-secret" not in redactor(message + " configured-secret-0007")
    # long runs of token characters must not make any pattern backtrack quadratically
    runs = ["a" * 50_000, "Bearer " + "b" * 50_000, "eyJ" + "c" * 50_000, "sk-" * 20_000]
    runs += [separated * 25_000 for separated in ("d_", "e.", "f:", "g-", "h@", "i/")]
    redacted = redactor(" ".join(runs))  # ~0.05 s; a quadratic pattern takes minutes (bench)
    assert "b" * 100 not in redacted and "a" * 50_000 in redacted


def test_log_records_are_redacted_where_they_are_made(caplog) -> None:
    import logging

    from recallq.core.redact import install_log_redaction

    secret = "configured-provider-key-0123456789"
    install_log_redaction(Redactor([secret]))
    try:
        logger = logging.getLogger("recallq.test_redaction")
        with caplog.at_level(logging.INFO, logger="recallq.test_redaction"):
            logger.info("provider said: %s", f"Incorrect API key provided: {secret}")
            logger.info("%s - %s %d", "127.0.0.1", "GET /x", 200)  # arguments stay arguments
            logger.info(f"api_key={secret} in the format string itself %s", "arg")
            try:
                raise ValueError(f"Authorization: Bearer {secret}")
            except ValueError:
                logger.exception("failed")
        text = caplog.text
        assert secret not in text and "[redacted]" in text
        assert "127.0.0.1 - GET /x 200" in text
        records = [r for r in caplog.records if r.name == "recallq.test_redaction"]
        assert records[1].args == ("127.0.0.1", "GET /x", 200)
    finally:
        install_log_redaction(Redactor())
