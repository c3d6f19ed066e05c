"""The web page at / and the API documentation, in a real browser: Debian's Chromium driven by Playwright, against a
real `memshelf serve` on loopback. Every request the page makes outside that server is refused, so a page that
needs the internet (a CDN) fails here as it would offline. Screenshots go to build/screenshots/ (README, "Web
page"), at desktop and phone widths, for a person to look at."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from memshelf import Memory, Owner, Shelf
from test_server import free_port, wait_healthy

pytestmark = pytest.mark.slow

SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                  "--disable-background-networking", "--disable-component-update"]
WIDTHS = {"desktop": (1280, 860), "phone": (390, 844)}
TENANT, USER = "home", "kaleb"


def chromium_path() -> str:
    """Debian's Chromium (or MEMSHELF_CHROMIUM); Playwright never downloads a browser of its own here."""
    path = os.environ.get("MEMSHELF_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("the browser tests need Chromium: install Debian's package (`sudo apt-get install chromium`) "
                    "or set MEMSHELF_CHROMIUM to a Chromium executable; `make test` installs it when run as root")
    return path


@dataclass
class Served:
    url: str
    db: Path
    secret: str
    admin: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`memshelf serve` as a user starts it, over a fresh SQLite file, with a key for the tenant."""
    db = tmp_path_factory.mktemp("web") / "memory.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key(TENANT, "browser")[1]
        admin = shelf.create_key(None, "admin")[1]
    port = free_port()
    env = {**os.environ, "MEMSHELF_EMBEDDER": "none", "MEMSHELF_ACCESS_LOG": "0", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "memshelf", "--db", str(db), "serve", "--port", str(port)],
                               env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process)
        yield Served(url, db, secret, admin)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    executable = chromium_path()
    with playwright.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(params=list(WIDTHS))
def page(request: pytest.FixtureRequest, browser: Any, served: Served) -> Iterator[Any]:
    """A page at one width whose requests may reach the server under test and nothing else."""
    width, height = WIDTHS[request.param]
    context = browser.new_context(viewport={"width": width, "height": height})
    outside: list[str] = []

    def only_the_server(route: Any) -> None:
        if route.request.url.startswith(served.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.set_default_timeout(10_000)
    context.route("**/*", only_the_server)
    opened = context.new_page()
    opened.width_name = request.param
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield opened
    finally:
        context.close()
    assert outside == [], f"the page asked for something outside the server: {outside}"
    assert errors == [], f"the page's script failed: {errors}"


def shot(page: Any, name: str, full_page: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}-{page.width_name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


PRINTER, TOMATOES = "The office printer is on 192.168.1.40.", "Water the <b>tomatoes</b> every morning."
LONG_LINK = "https://wiki.example.org/" + "a-path-segment-that-never-breaks" * 8


def seed(served: Served, user: str, *memories: tuple[str, str]) -> list[Memory]:
    """The user's memories become exactly these (the module's tests share one server and database)."""
    owner = Owner(TENANT, user)
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.forget_user(owner)
        return shelf.remember_many(owner, [{"topic": topic, "content": content} for topic, content in memories])


def stored_topics(served: Served, user: str) -> list[str]:
    with Shelf.open(served.db, embedder=None) as shelf:
        return sorted(m.topic for m in shelf.list_memories(Owner(TENANT, user), limit=1000)[0])


def open_as(page: Any, served: Served, user: str, key: str | None = None) -> None:
    page.goto(served.url + "/")
    page.get_by_label("API key").fill(served.secret if key is None else key)
    page.get_by_label("User", exact=True).fill(user)


def show_memories(page: Any, count: int) -> None:
    page.get_by_role("button", name="Show memories").click()
    page.wait_for_function("n => document.querySelectorAll('#rows tr').length === n", arg=count)


def focused(page: Any) -> str:
    """The focused control: its id, else its accessible label, else its text."""
    return str(page.evaluate("(() => { const e = document.activeElement; "
                             "return e.id || e.getAttribute('aria-label') || e.textContent.trim(); })()"))


def assert_fits(page: Any, state: str) -> None:
    """Nothing is wider than the viewport, so nothing needs sideways scrolling (the phone width is the test)."""
    wide, viewport = page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
    assert wide <= viewport, f"{state}: the page is {wide} px wide in a {viewport} px viewport"


def answer_dialogs(page: Any, accept: bool) -> list[str]:
    """Answer every confirm the page asks; the list collects what they said."""
    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.on("dialog", answer)
    return asked


def test_the_page_lists_searches_and_forgets_a_users_memories(page: Any, served: Served) -> None:
    printer = seed(served, USER, ("office", PRINTER), ("garden", TOMATOES))[0]
    open_as(page, served, USER)
    page.get_by_role("button", name="Show memories").click()
    page.get_by_text("2 memories shown").wait_for()
    assert TOMATOES in page.locator("#rows").inner_text() and page.locator("#rows b").count() == 0  # text, not HTML
    shot(page, "memories")

    page.get_by_label("Question").fill("printer")
    page.get_by_role("button", name="Search", exact=True).click()
    page.get_by_text("1 hit (keyword)").wait_for()
    assert page.locator("#rows tr").count() == 1
    assert "192.168.1.40" in page.locator("#rows").inner_text()
    shot(page, "search")

    asked = answer_dialogs(page, accept=True)
    page.get_by_role("button", name="Forget").click()
    page.get_by_text(f"Forgot “{printer.content}”").wait_for()
    assert len(asked) == 1 and PRINTER in asked[0]
    assert stored_topics(served, USER) == ["garden"]


@pytest.mark.parametrize("which", ["wrong", "admin"])
def test_a_key_that_cannot_read_says_what_to_do(page: Any, served: Served, which: str) -> None:
    key, says = {"wrong": ("ms_not_a_real_key", "This API key is wrong or revoked"),
                 "admin": (served.admin, "This is an admin key")}[which]
    open_as(page, served, USER, key=key)
    page.get_by_role("button", name="Show memories").click()
    status = page.locator("#status")
    status.get_by_text(says).wait_for()
    assert "memshelf keys create --tenant NAME" in status.inner_text()
    assert "Authorization" not in status.inner_text()  # the page's terms, not the HTTP API's
    assert "error" in (status.get_attribute("class") or "") and focused(page) == "key"


def test_a_server_that_does_not_answer_is_a_sentence_on_the_page(page: Any, served: Served) -> None:
    open_as(page, served, USER)
    page.route("**/v1/**", lambda route: route.abort())  # as when memshelf serve has stopped
    page.get_by_role("button", name="Show memories").click()
    page.locator("#status").get_by_text("The server did not answer: check that memshelf serve is still").wait_for()


def test_a_key_without_a_user_asks_for_the_user(page: Any, served: Served) -> None:
    page.goto(served.url + "/")
    page.get_by_label("API key").fill(served.secret)
    page.locator("#question").fill("printer")
    status = page.locator("#status")
    for button in ["Show memories", "Search", "Erase this user"]:
        page.evaluate("document.getElementById('status').textContent = ''")
        page.get_by_role("button", name=button).first.click()
        status.get_by_text("Type the user's id first").wait_for()
        assert "endpoint" not in status.inner_text() and focused(page) == "user"
    assert page.get_by_label("User", exact=True).get_attribute("aria-invalid") == "true"


def test_an_empty_search_asks_for_something_to_search_for(page: Any, served: Served) -> None:
    seed(served, USER, ("office", PRINTER))
    open_as(page, served, USER)
    show_memories(page, 1)
    status = page.locator("#status")
    for question in ["", "   "]:
        page.locator("#question").fill(question)
        page.get_by_role("button", name="Search", exact=True).click()
        status.get_by_text("Type something to search for").wait_for()
        assert "question" not in status.inner_text() and focused(page) == "question"
    assert page.locator("#rows tr").count() == 1  # nothing was searched, so the list stays


def test_erasing_the_user_leaves_nothing_of_them_on_the_page(page: Any, served: Served) -> None:
    seed(served, USER, *[("note", f"Note number {n}.") for n in range(55)])
    open_as(page, served, USER)
    show, more = page.get_by_role("button", name="Show memories"), page.get_by_role("button", name="More")
    show.click()
    page.get_by_text("50 memories shown").wait_for()
    more.click()
    page.get_by_text("55 memories shown").wait_for()
    assert page.locator("#rows tr").count() == 55 and more.is_hidden()
    show.click()
    page.get_by_text("50 memories shown").wait_for()
    assert more.is_visible()

    asked = answer_dialogs(page, accept=True)
    page.get_by_role("button", name="Erase this user").click()
    page.locator("#status").get_by_text(re.compile(r"Erased .*55 memories")).wait_for()
    assert len(asked) == 1 and USER in asked[0]
    assert page.locator("#rows tr").count() == 0 and more.is_hidden() and page.locator("#results").is_hidden()
    assert "shown" not in page.locator("#status").inner_text()
    assert stored_topics(served, USER) == []
    shot(page, "erased")
    show.click()
    page.get_by_text(f"{USER} has no memories here").wait_for()
    assert page.locator("#results").is_hidden()


def test_another_user_or_key_clears_the_rows_shown(page: Any, served: Served) -> None:
    seed(served, USER, *[("note", f"Note number {n}.") for n in range(51)])
    for field in ["User", "API key"]:
        open_as(page, served, USER)
        page.get_by_role("button", name="Show memories").click()
        page.get_by_text("50 memories shown").wait_for()
        page.get_by_label(field, exact=True).fill("ana" if field == "User" else "ms_another_key")
        assert page.locator("#rows tr").count() == 0 and page.get_by_role("button", name="More").is_hidden()
        assert page.locator("#status").inner_text() == ""


def test_forget_asks_first_and_dismissing_keeps_the_memory(page: Any, served: Served) -> None:
    seed(served, USER, ("office", PRINTER))
    open_as(page, served, USER)
    show_memories(page, 1)
    asked = answer_dialogs(page, accept=False)
    page.get_by_role("button", name="Forget").click()
    page.evaluate("1")  # a round trip: the confirm, if any, has been answered
    assert len(asked) == 1 and PRINTER in asked[0] and "cannot be undone" in asked[0]
    assert stored_topics(served, USER) == ["office"]
    assert page.locator("#rows tr").count() == 1 and "Forgot" not in page.locator("#status").inner_text()


def test_forgetting_a_memory_forgotten_elsewhere_just_removes_its_row(page: Any, served: Served) -> None:
    printer, tomatoes = seed(served, USER, ("office", PRINTER), ("garden", TOMATOES))
    open_as(page, served, USER)
    show_memories(page, 2)
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.forget(Owner(TENANT, USER), printer.id)
    answer_dialogs(page, accept=True)
    page.get_by_role("button", name="Forget office").click()
    page.get_by_text(f"Already forgotten: “{PRINTER}”").wait_for()
    assert page.locator("#rows tr").count() == 1 and focused(page).startswith("Forget garden")
    assert stored_topics(served, USER) == ["garden"]


def test_the_page_fits_the_screen(page: Any, served: Served) -> None:
    seed(served, USER, ("a-topic-without-any-spaces-" * 4, f"Read {LONG_LINK}"), ("office", PRINTER))
    page.goto(served.url + "/")
    assert_fits(page, "empty")
    shot(page, "empty")
    open_as(page, served, USER)
    page.get_by_role("button", name="Show memories").click()
    page.get_by_text("2 memories shown").wait_for()
    assert_fits(page, "memories")
    shot(page, "long-lines")
    page.locator("#question").fill("printer")
    page.get_by_role("button", name="Search", exact=True).click()
    page.get_by_text("1 hit").wait_for()
    assert_fits(page, "search")
    page.get_by_label("User", exact=True).fill("")
    page.get_by_role("button", name="Show memories").click()
    page.get_by_text("Type the user's id first").wait_for()
    assert_fits(page, "error")
    shot(page, "error")


def tab_to(page: Any, expected: str) -> None:
    """Tab once; the focus lands on `expected` (an id, or the start of a label) and shows a ring."""
    page.keyboard.press("Tab")
    assert focused(page).startswith(expected)
    ring = page.evaluate("(() => { const s = getComputedStyle(document.activeElement); "
                         "return [s.outlineStyle, parseFloat(s.outlineWidth)]; })()")
    assert ring[0] != "none" and ring[1] >= 2, f"no visible focus on {expected}: {ring}"


def test_the_keyboard_alone_loads_searches_and_forgets(page: Any, served: Served) -> None:
    seed(served, USER, ("office", PRINTER), ("garden", TOMATOES))
    page.goto(served.url + "/")
    unlabelled = page.evaluate("[...document.querySelectorAll('input, select, textarea')]"
                               ".filter((e) => !e.labels.length).map((e) => e.id)")
    assert unlabelled == []
    keyboard = page.keyboard
    tab_to(page, "key")
    keyboard.type(served.secret)
    tab_to(page, "user")
    keyboard.type(USER)
    keyboard.press("Enter")
    page.get_by_text("2 memories shown").wait_for()
    tab_to(page, "load")
    tab_to(page, "question")
    keyboard.type("printer")
    keyboard.press("Enter")
    page.get_by_text("1 hit (keyword)").wait_for()
    tab_to(page, "search")
    tab_to(page, "Forget office")
    shot(page, "keyboard")
    asked = answer_dialogs(page, accept=True)
    keyboard.press("Enter")
    page.get_by_text("Forgot").wait_for()
    assert len(asked) == 1 and stored_topics(served, USER) == ["garden"]
    assert focused(page) == "question"  # the only hit is gone: back to the question


@pytest.mark.parametrize("path, shows", [("/docs", "POST/v1/users/{user}/memories"), ("/redoc", "memshelf API")])
def test_the_api_documentation_works_offline(page: Any, served: Served, path: str, shows: str) -> None:
    """Swagger UI and ReDoc load their scripts from the server itself, never from a CDN."""
    response = page.goto(served.url + path)
    assert response is not None and response.ok
    if path == "/docs":
        page.locator(".opblock-summary").first.wait_for()
        assert shows in page.locator(".swagger-ui").inner_text().replace("\n", "").replace("\u200b", "")
    else:
        page.locator(".api-content").wait_for()
        assert page.title() == shows and "Remember" in page.locator(".api-content").inner_text()
    shot(page, path.strip("/"), full_page=False)  # the whole reference is tens of thousands of pixels long


def test_documentation_assets_are_the_servers_own(served: Served) -> None:
    for name, kind in [("swagger-ui-bundle.js", "javascript"), ("swagger-ui.css", "css"),
                       ("redoc.standalone.js", "javascript"), ("favicon.png", "png")]:
        answer = httpx.get(f"{served.url}/docs/assets/{name}")
        assert answer.status_code == 200 and kind in answer.headers["content-type"] and len(answer.content) > 1000
    assert httpx.get(f"{served.url}/docs/assets/..%2Fcore.py").status_code == 404
    assert httpx.get(f"{served.url}/docs/assets/core.py").status_code == 404
