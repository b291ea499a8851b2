"""Cancel and retry from the run page change the run as the JSON API would; a POST without the
page's CSRF token is refused, from the same browser and from a page on another site."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.browser import evalsets
from tests.browser.conftest import Stack, shoot, sign_in

STUB_KEY = "sk-stub-secret"  # the key the workers send the stub (service env STUB_API_KEY)


def _submit_button(page: Any, form: str) -> Any:
    return page.locator(f"form[data-testid={form}]").locator("button, input[type=submit]")


def _path(url: str) -> str:
    return urlsplit(url).path


def _accept_dialogs(page: Any) -> None:
    """A confirm() before a cancel is answered yes, as the user would (Playwright says no)."""
    page.on("dialog", lambda dialog: dialog.accept())


def test_cancel_from_the_page_cancels_the_run(
    stack: Stack, context: Any, screenshots: Path
) -> None:
    stack.stub.configure(latency_ms=1000)
    try:
        run_id = stack.submit(evalsets.plain(80, "c"), "to-cancel")
        page = sign_in(context, stack.url, stack.keys["alpha_write"])
        _accept_dialogs(page)
        page.goto(f"{stack.url}/runs/{run_id}")
        assert stack.get(f"/v1/runs/{run_id}")["status"] in ("queued", "running")
        with page.expect_navigation():
            _submit_button(page, "cancel").click()
        assert _path(page.url) == f"/runs/{run_id}"  # back on the run page (303)
        run = stack.wait(run_id)
    finally:
        stack.stub.configure(latency_ms=0)
    assert run["status"] == "cancelled" and run["cancel_reason"] == "user"
    assert run["counts"]["cancelled"] > 0
    page.reload()
    assert page.locator("[data-testid=run-status]").inner_text().strip() == "cancelled"
    cancelled = page.locator('[data-testid=counts] [data-count="cancelled"]')
    assert int(cancelled.get_attribute("data-value")) == run["counts"]["cancelled"]
    assert page.locator("form[data-testid=cancel]").count() == 0  # nothing left to cancel
    shoot(page, screenshots, "run-cancelled")
    # the runs page does not show a cancelled run's bar as full: it counts what ended scored
    page.goto(f"{stack.url}/")
    progress = page.locator(f'tr[data-run-id="{run_id}"] [data-field=progress]')
    c = run["counts"]
    assert int(progress.get_attribute("data-value")) == c["succeeded"] + c["failed"]
    assert f"{c['cancelled']:,} cancelled" in progress.inner_text()


def test_retry_from_the_page_scores_the_failed_items_again(
    stack: Stack, context: Any, screenshots: Path
) -> None:
    stack.stub.configure(reject_keys=[STUB_KEY])  # the provider refuses the key: items fail
    try:
        run_id = stack.submit(evalsets.plain(3, "r"), "to-retry")
        failed = stack.wait(run_id)
    finally:
        stack.stub.configure(reject_keys=[])
    assert failed["counts"]["failed"] == 3, failed
    page = sign_in(context, stack.url, stack.keys["alpha_write"])
    _accept_dialogs(page)
    page.goto(f"{stack.url}/runs/{run_id}")
    group = page.locator("[data-testid=failures] [data-error-group]")
    assert group.count() == 1 and group.get_attribute("data-count") == "3"
    assert "AuthenticationError" in group.inner_text()
    assert STUB_KEY not in page.content()  # the provider echoed it; recallq redacted it
    shoot(page, screenshots, "run-failed")

    with page.expect_navigation():
        _submit_button(page, "retry").click()
    assert _path(page.url) == f"/runs/{run_id}"
    run = stack.wait(run_id)
    assert run["status"] == "completed"
    assert run["counts"] | {"total": 3} == {
        "total": 3,
        "pending": 0,
        "running": 0,
        "succeeded": 3,
        "failed": 0,
        "cancelled": 0,
    }
    page.reload()
    assert page.locator("[data-testid=failures] [data-error-group]").count() == 0


def test_a_post_without_the_csrf_token_is_refused(stack: Stack, browser: Any, context: Any) -> None:
    run_id = stack.runs["retriever_a"]  # completed, with failed items a retry would re-queue
    before = stack.get(f"/v1/runs/{run_id}")
    page = sign_in(context, stack.url, stack.keys["alpha_write"])
    page.goto(f"{stack.url}/runs/{run_id}")
    token = page.locator("form[data-testid=retry] input[name=csrf_token]").input_value()
    assert token

    # the session cookie goes with these requests (the context's own), the token does not
    for action in ("retry", "cancel"):
        for form in ({}, {"csrf_token": ""}, {"csrf_token": "forged" + token[6:]}):
            refused = context.request.post(
                f"{stack.url}/runs/{run_id}/{action}", form=form, max_redirects=0
            )
            assert refused.status == 403, (action, form, refused.status)

    # a token is its session's: another signed-in browser's token does not do either
    other = browser.new_context()
    try:
        theirs = sign_in(other, stack.url, stack.keys["alpha_write"])
        theirs.goto(f"{stack.url}/runs/{run_id}")
        their_token = theirs.locator("form[data-testid=retry] input[name=csrf_token]")
        swapped = context.request.post(
            f"{stack.url}/runs/{run_id}/retry",
            form={"csrf_token": their_token.input_value()},
            max_redirects=0,
        )
        assert swapped.status == 403
    finally:
        other.close()

    # a page of another site posting the form: its request carries no session (SameSite)
    # and no token, so it changes nothing
    attacker = "http://attacker.test/"
    forged_form = (
        f'<form id="f" method="post" action="{stack.url}/runs/{run_id}/retry">'
        '<input name="csrf_token" value="guess"></form>'
        '<script>document.getElementById("f").submit()</script>'
    )
    context.route(
        attacker,
        lambda route: route.fulfill(status=200, content_type="text/html", body=forged_form),
    )
    answers: list[Any] = []
    attack = context.new_page()
    attack.on(
        "response",
        lambda r: answers.append(r) if r.url.endswith(f"/runs/{run_id}/retry") else None,
    )
    with attack.expect_navigation(url=lambda url: url.startswith(stack.url)):
        attack.goto(attacker)
    attack.wait_for_load_state()
    assert answers and answers[0].status in (303, 403), [a.status for a in answers]
    if answers[0].status == 303:  # sent to sign in: the session cookie stayed home
        assert "/signin" in answers[0].headers["location"]

    after = stack.get(f"/v1/runs/{run_id}")
    assert after["counts"] == before["counts"] and after["status"] == "completed"


def test_a_read_key_may_not_cancel_or_retry(stack: Stack, context: Any) -> None:
    run_id = stack.runs["retriever_a"]
    page = sign_in(context, stack.url, stack.keys["alpha_read"])
    page.goto(f"{stack.url}/runs/{run_id}")
    # the read session's own token (its sign-out form has one): refused for the role alone
    token = page.locator("input[name=csrf_token]").first.input_value()
    assert token
    for action in ("retry", "cancel"):
        response = context.request.post(
            f"{stack.url}/runs/{run_id}/{action}", form={"csrf_token": token}, max_redirects=0
        )
        assert response.status == 403, action
    assert stack.get(f"/v1/runs/{run_id}")["counts"]["failed"] == 2


def test_cancel_asks_first_and_resume_from_the_page_finishes_the_run(
    stack: Stack, context: Any, screenshots: Path
) -> None:
    stack.stub.configure(latency_ms=1000)
    try:
        run_id = stack.submit(evalsets.plain(40, "z"), "to-resume")
        page = sign_in(context, stack.url, stack.keys["alpha_write"])
        page.goto(f"{stack.url}/runs/{run_id}")
        asked: list[str] = []

        def say_no(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.dismiss()

        page.once("dialog", say_no)
        _submit_button(page, "cancel").click()
        page.wait_for_timeout(500)  # a POST would have navigated by now
        assert asked and "Cancel this run?" in asked[0]
        assert _path(page.url) == f"/runs/{run_id}"
        assert stack.get(f"/v1/runs/{run_id}")["status"] in ("queued", "running")

        _accept_dialogs(page)
        with page.expect_navigation():
            _submit_button(page, "cancel").click()
        cancelled = stack.wait(run_id)
        assert cancelled["status"] == "cancelled" and cancelled["counts"]["cancelled"] > 0
        page.reload()
        assert page.locator("form[data-testid=resume]").count() == 1
        shoot(page, screenshots, "run-resumable")
    finally:
        stack.stub.configure(latency_ms=0)
    with page.expect_navigation():
        _submit_button(page, "resume").click()
    assert _path(page.url) == f"/runs/{run_id}"
    assert "Run resumed" in page.locator("[data-testid=message]").inner_text()
    run = stack.wait(run_id)
    assert run["status"] == "completed", run
    assert run["counts"]["cancelled"] == 0 and run["counts"]["succeeded"] == 40
    page.reload()
    assert page.locator("form[data-testid=resume]").count() == 0
