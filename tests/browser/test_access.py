"""Keys in the browser: no page without signing in, another project's run is a 404 exactly
like a run that never existed, and the key is never in a URL, a page or a cookie."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote, urlsplit

from tests.browser.conftest import SECRET, Stack, sign_in


def _pages(run_id: str, other_id: str) -> list[str]:
    return [
        f"/runs/{run_id}",
        f"/runs/{run_id}/items",
        f"/runs/{run_id}/items/q0",
        f"/compare?base={run_id}&candidate={other_id}",
        f"/compare/items/q0?base={run_id}&candidate={other_id}",
    ]


def test_without_a_key_every_page_sends_you_to_sign_in(stack: Stack, context: Any) -> None:
    run_a, run_b = stack.runs["retriever_a"], stack.runs["retriever_b"]
    for path in ["/", *_pages(run_a, run_b)]:
        response = context.request.get(f"{stack.url}{path}", max_redirects=0)
        assert response.status == 303, (path, response.status)
        location = urlsplit(response.headers["location"])
        assert location.path == "/signin" and location.netloc in ("", urlsplit(stack.url).netloc)
    for action in ("cancel", "retry"):
        refused = context.request.post(f"{stack.url}/runs/{run_a}/{action}", max_redirects=0)
        assert refused.status in (303, 403), action

    page = context.new_page()
    page.goto(f"{stack.url}/runs/{run_a}/items?status=failed")
    assert urlsplit(page.url).path == "/signin"
    assert page.locator("input[name=key]").count() == 1
    # signing in leads back to the page asked for
    page.fill("input[name=key]", stack.keys["alpha_read"])
    with page.expect_navigation():
        page.press("input[name=key]", "Enter")
    assert page.url == f"{stack.url}/runs/{run_a}/items?status=failed"
    assert page.locator("table[data-testid=items] tr[data-item-id]").count() == 2


def test_the_key_is_never_in_a_url_a_page_or_a_cookie(stack: Stack, context: Any) -> None:
    key = stack.keys["alpha_write"]
    run_a, run_b = stack.runs["retriever_a"], stack.runs["retriever_b"]
    requested: list[str] = []
    context.on("request", lambda request: requested.append(request.url))
    page = sign_in(context, stack.url, key)
    for path in ["/", *_pages(run_a, run_b)]:
        response = page.goto(f"{stack.url}{path}")
        assert response is not None and response.status == 200, path
        html = page.content()
        assert key not in html and not SECRET.search(html), path
        assert key not in page.url
    assert requested and not [url for url in requested if key in url]
    cookies = context.cookies()
    assert cookies and not [c for c in cookies if key in c["value"] or c["value"] in key]
    session = [c for c in cookies if c["httpOnly"]]
    assert session and {c["sameSite"] for c in session} == {"Strict"}
    assert key not in stack.logs()


def test_another_projects_run_is_a_404_like_no_run(stack: Stack, context: Any) -> None:
    run_a, run_b = stack.runs["retriever_a"], stack.runs["retriever_b"]
    never = str(uuid.uuid4())
    page = sign_in(context, stack.url, stack.keys["beta_write"])
    for theirs, missing in zip(_pages(run_a, run_b), _pages(never, never), strict=True):
        seen = page.goto(f"{stack.url}{theirs}")
        seen_text = page.locator("body").inner_text()
        absent = page.goto(f"{stack.url}{missing}")
        absent_text = page.locator("body").inner_text()
        assert seen is not None and absent is not None
        assert seen.status == absent.status == 404, (theirs, seen.status)
        assert seen_text.replace(run_a, "ID").replace(run_b, "ID") == absent_text.replace(
            never, "ID"
        )
        assert "retriever-a" not in seen_text and "Marie Curie" not in seen_text
    page.goto(f"{stack.url}/")
    assert page.locator(f'tr[data-run-id="{run_a}"]').count() == 0
    for action in ("cancel", "retry"):
        token = page.locator("input[name=csrf_token]")
        form = {"csrf_token": token.first.input_value()} if token.count() else {}
        response = context.request.post(
            f"{stack.url}/runs/{run_a}/{action}", form=form, max_redirects=0
        )
        assert response.status in (403, 404), action
    assert stack.get(f"/v1/runs/{run_a}")["counts"]["failed"] == 2


def test_a_wrong_key_signs_nobody_in(stack: Stack, context: Any) -> None:
    wrong = "rq_" + "A" * 43
    page = context.new_page()
    page.goto(f"{stack.url}/signin")
    page.fill("input[name=key]", wrong)
    with page.expect_navigation():
        page.press("input[name=key]", "Enter")
    assert urlsplit(page.url).path == "/signin"
    assert wrong not in page.content()  # not echoed back into the form
    assert wrong not in stack.logs()
    assert context.request.get(f"{stack.url}/", max_redirects=0).status == 303


def test_sign_in_only_goes_on_to_a_page_of_this_site(stack: Stack, context: Any) -> None:
    for target in ("https://attacker.test/x", "//attacker.test/x", "/\\attacker.test/x"):
        page = context.new_page()
        page.goto(f"{stack.url}/signin?next={quote(target, safe='')}")
        page.fill("input[name=key]", stack.keys["alpha_read"])
        with page.expect_navigation():
            page.press("input[name=key]", "Enter")
        assert page.url.startswith(stack.url + "/"), (target, page.url)
        page.close()
