"""The web page at / and the API documentation, in a real browser: Debian's Chromium driven by Playwright, against a
real `memshelf serve` on loopback. Every request the page makes outside that server is refused, so a page that
needs the internet (a CDN) fails here as it would offline. Screenshots go to build/screenshots/ (README, "Web
page"), at desktop and phone widths, for a person to look at."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from memshelf import Owner, Shelf
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


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`memshelf serve` as a user starts it, over a fresh SQLite file, with a key for the tenant."""
    db = tmp_path_factory.mktemp("web") / "memory.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key(TENANT, "browser")[1]
    port = free_port()
    env = {**os.environ, "MEMSHELF_EMBEDDER": "none", "MEMSHELF_ACCESS_LOG": "0", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "memshelf", "--db", str(db), "serve", "--port", str(port)],
                               env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process)
        yield Served(url, db, secret)
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


def test_the_page_lists_searches_and_forgets_a_users_memories(page: Any, served: Served) -> None:
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.forget_user(Owner(TENANT, USER))
        printer = shelf.remember(Owner(TENANT, USER), "office", "The office printer is on 192.168.1.40.")
        shelf.remember(Owner(TENANT, USER), "garden", "Water the <b>tomatoes</b> every morning.")
    page.goto(served.url + "/")
    page.get_by_label("API key").fill(served.secret)
    page.get_by_label("User").fill(USER)
    page.get_by_role("button", name="Show memories").click()
    page.get_by_text("2 memories shown").wait_for()
    assert page.get_by_role("cell", name="Water the <b>tomatoes</b> every morning.").count() == 1  # text, not HTML
    shot(page, "memories")

    page.locator("#question").fill("printer")
    page.get_by_role("button", name="Search", exact=True).click()
    page.get_by_text("1 hits (keyword)").wait_for()
    assert page.locator("#rows tr").count() == 1
    assert "192.168.1.40" in page.locator("#rows").inner_text()

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Forget").click()
    page.get_by_text(f"Forgot {printer.id}").wait_for()
    with Shelf.open(served.db, embedder=None) as shelf:
        assert [m.topic for m in shelf.list_memories(Owner(TENANT, USER))[0]] == ["garden"]


def test_a_wrong_key_is_a_sentence_on_the_page(page: Any, served: Served) -> None:
    page.goto(served.url + "/")
    page.get_by_label("API key").fill("ms_not_a_real_key")
    page.get_by_label("User").fill(USER)
    page.get_by_role("button", name="Show memories").click()
    status = page.locator("#status")
    status.get_by_text("wrong or revoked API key").wait_for()
    assert "error" in (status.get_attribute("class") or "")


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
