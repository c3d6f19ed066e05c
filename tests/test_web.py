"""The web page at / and the API documentation, in a real browser: Debian's Chromium driven by Playwright, against a
real `memshelf serve` on loopback. Every request the page makes outside that server is refused, so a page that
needs the internet (a CDN) fails here as it would offline. Screenshots go to build/screenshots/ (README, "Web
page"), at desktop and phone widths, for a person to look at."""

from __future__ import annotations

import json
import os
import re
from memshelf.stores.sqlite import sqlite3  # the store's own SQLite: another in this process must not open its files
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from memshelf import Memory, Owner, Shelf, model
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


@contextmanager
def serving(db: Path, embedder: str) -> Iterator[str]:
    """`memshelf serve` as a user starts it, on this database with this embedder; yields its URL."""
    port = free_port()
    env = {**os.environ, "MEMSHELF_EMBEDDER": embedder, "MEMSHELF_ACCESS_LOG": "0", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "memshelf", "--db", str(db), "serve", "--port", str(port)],
                               env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process)
        yield url
    finally:
        process.terminate()  # uvicorn waits for open connections to close; a browser may hold some open
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server with no embedder over a fresh SQLite file, with a key for the tenant and an admin key."""
    db = tmp_path_factory.mktemp("web") / "memory.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key(TENANT, "browser")[1]
        admin = shelf.create_key(None, "admin")[1]
    with serving(db, "none") as url:
        yield Served(url, db, secret, admin)


@pytest.fixture(scope="module")
def browser(served: Served) -> Iterator[Any]:
    """Chromium, closed before the module's server stops (its idle connections would hold the server open)."""
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


def seed(served: Served, user: str, *memories: tuple[str, ...]) -> list[Memory]:
    """The user's records become exactly these memories, (topic, content) or (topic, content, source): the module's
    tests share one server and database."""
    owner = Owner(TENANT, user)
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.forget_user(owner)
        return shelf.remember_many(owner, [{"topic": m[0], "content": m[1], "source": m[2] if len(m) > 2 else "stated"}
                                           for m in memories])


def stored_topics(served: Served, user: str) -> list[str]:
    with Shelf.open(served.db, embedder=None) as shelf:
        return sorted(m.topic for m in shelf.list_memories(Owner(TENANT, user), limit=1000)[0])


def open_as(page: Any, served: Served, user: str, key: str | None = None) -> None:
    page.goto(served.url + "/")
    page.get_by_label("API key").fill(served.secret if key is None else key)
    page.get_by_label("User", exact=True).fill(user)


def show_memories(page: Any, count: int) -> None:
    page.get_by_role("button", name="Show memories").click()
    if count == 0:  # no row to wait for: wait for the answer, or it may land after the next step's and hide it
        status(page).get_by_text("has no memories here").wait_for()
    page.wait_for_function("n => document.querySelectorAll('#rows tr').length === n", arg=count)


def status(page: Any) -> Any:
    return page.locator("#status")


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


def row_of(page: Any, text: str) -> Any:
    return page.locator("#rows tr", has_text=text)


def search_for(page: Any, question: str) -> None:
    page.get_by_role("tab", name="Search").click()
    page.get_by_label("Question").fill(question)
    page.get_by_role("button", name="Search", exact=True).click()


# ---------------------------------------------------------------------------------------------- reading
def test_the_page_lists_searches_and_forgets_a_users_memories(page: Any, served: Served) -> None:
    printer = seed(served, USER, ("office", PRINTER), ("garden", TOMATOES))[0]
    open_as(page, served, USER)
    page.get_by_role("button", name="Show memories").click()
    page.get_by_text("2 memories shown").wait_for()
    assert TOMATOES in page.locator("#rows").inner_text() and page.locator("#rows b").count() == 0  # text, not HTML
    shot(page, "memories")

    search_for(page, "printer")
    page.get_by_text("1 hit (keyword)").wait_for()
    assert page.locator("#hit-rows tr").count() == 1
    assert "192.168.1.40" in page.locator("#hit-rows").inner_text()

    asked = answer_dialogs(page, accept=True)
    page.locator("#hit-rows").get_by_role("button", name="Forget").click()
    status(page).get_by_text(f"Forgot “{printer.content}”").wait_for()
    assert len(asked) == 1 and PRINTER in asked[0]
    assert stored_topics(served, USER) == ["garden"]
    assert focused(page) == "question"  # the only hit is gone: back to the question
    page.get_by_role("tab", name="Memories").click()
    page.get_by_text("1 memory shown").wait_for()


def test_the_tenants_users_are_listed_with_their_counts_filtered_and_opened(page: Any, served: Served) -> None:
    for user in ["ana", "ben", "dan_b"]:
        seed(served, user, ("desk", f"{user}'s desk is by the window."))
    seed(served, USER, ("office", PRINTER), ("garden", TOMATOES))
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.set_fact(Owner(TENANT, USER), "user_name", "Kaleb")
        shelf.log_message(Owner(TENANT, USER), "t1", "user", "Hello there.")
        shelf.remember(Owner("elsewhere", "zed"), "x", "Another tenant's user.")
    page.goto(served.url + "/")
    page.get_by_label("API key").fill(served.secret)
    page.get_by_role("button", name="List users").click()
    status(page).get_by_text(re.compile(r"\d+ users shown")).wait_for()
    listed = page.locator("#user-rows tr")
    users = [listed.nth(n).locator("td").first.inner_text() for n in range(listed.count())]
    assert {"ana", "ben", "dan_b", USER} <= set(users) and "zed" not in users and users == sorted(users)
    kaleb = page.locator("#user-rows tr", has_text=USER)
    assert [kaleb.locator("td").nth(n).inner_text() for n in range(1, 4)] == ["2", "1", "1"]
    assert "UTC" in kaleb.locator("td").nth(4).inner_text()
    shot(page, "users")

    page.get_by_label("Filter users by id").fill("N_")
    page.get_by_role("button", name="Filter").click()
    status(page).get_by_text("1 user whose id contains “N_” shown").wait_for()
    assert page.locator("#user-rows tr").count() == 1 and "dan_b" in page.locator("#user-rows").inner_text()
    page.get_by_label("Filter users by id").fill("nobody-has-this")
    page.get_by_role("button", name="Filter").click()
    status(page).get_by_text("No user's id contains “nobody-has-this”").wait_for()

    page.get_by_label("Filter users by id").fill("")
    page.get_by_role("button", name="Filter").click()
    page.get_by_role("button", name=f"Open {USER}").click()
    page.get_by_text("2 memories shown").wait_for()
    assert page.get_by_label("User", exact=True).input_value() == USER and page.locator("#users-panel").is_hidden()
    assert page.get_by_role("heading", name=f"User {USER}").is_visible()


def test_memories_filter_by_topic_source_and_text_order_by_confidence_and_show_what_replaced_them(
        page: Any, served: Served) -> None:
    old, _, _, new = seed(served, USER, ("home", "Kaleb lives in Porto.", "mined"), ("office", PRINTER, "inferred"),
                          ("garden", TOMATOES, "stated"), ("home", "Kaleb lives in Lisbon.", "stated"))
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.store.supersede_memory(Owner(TENANT, USER), old.id, new.id, shelf.now())
    open_as(page, served, USER)
    show_memories(page, 3)

    def apply(count: int) -> list[str]:
        page.get_by_role("button", name="Apply").click()
        page.wait_for_function("n => document.querySelectorAll('#rows tr').length === n", arg=count)
        return page.locator("#rows .content").all_inner_texts()

    page.get_by_label("Source").select_option("inferred")
    assert apply(1) == [PRINTER]
    page.get_by_label("Source").select_option("")
    page.get_by_label("Text").fill("LISBON")
    assert apply(1) == ["Kaleb lives in Lisbon."]
    page.get_by_label("Text").fill("")
    page.get_by_label("Topic").fill("garden")
    assert apply(1) == [TOMATOES]
    page.get_by_label("Topic").fill("")
    page.get_by_label("Order").select_option("confident")
    assert apply(3)[-1] == PRINTER  # inferred (0.4) last
    page.get_by_label("Topic").fill("nothing-like-this")
    apply(0)
    status(page).get_by_text("None of kaleb's memories match these filters").wait_for()
    page.get_by_label("Topic").fill("home")
    page.get_by_label("Show superseded").check()
    assert apply(2) == ["Kaleb lives in Lisbon.", "Kaleb lives in Porto."]
    replaced = row_of(page, "Porto")
    replaced.get_by_text("“Kaleb lives in Lisbon.”").wait_for()
    assert "Superseded" in replaced.inner_text()
    assert replaced.get_by_role("button", name=re.compile("^Confirm")).count() == 0  # what replaced it is current
    assert_fits(page, "filters")
    shot(page, "superseded")


# ---------------------------------------------------------------------------------------------- fixing
def test_confirming_a_guess_makes_it_stated_and_says_when(page: Any, served: Served) -> None:
    guess = seed(served, USER, ("office", PRINTER, "inferred"), ("garden", TOMATOES, "stated"))[0]
    open_as(page, served, USER)
    show_memories(page, 2)
    assert row_of(page, "tomatoes").get_by_role("button", name=re.compile("^Confirm")).count() == 0  # stated already
    row_of(page, "printer").get_by_role("button", name=re.compile("^Confirm")).click()
    status(page).get_by_text(f"Confirmed “{PRINTER}”: it now counts as said by {USER} (was inferred).").wait_for()
    confirmed = row_of(page, "printer")
    assert "Confirmed by the user" in confirmed.inner_text() and "stated" in confirmed.inner_text()
    assert confirmed.get_by_role("button", name=re.compile("^Confirm")).count() == 0
    assert focused(page).startswith("Change the expiry of office")
    with Shelf.open(served.db, embedder=None) as shelf:
        memory = shelf.get(Owner(TENANT, USER), guess.id)
    assert (memory.source, memory.confirmed_from) == ("stated", "inferred") and memory.confirmed_at is not None
    shot(page, "confirmed")


def test_an_expiry_is_changed_in_a_dialog_and_a_past_date_is_refused_in_words(page: Any, served: Served) -> None:
    memory = seed(served, USER, ("office", PRINTER))[0]
    owner = Owner(TENANT, USER)
    open_as(page, served, USER)
    show_memories(page, 1)
    page.get_by_role("button", name=re.compile("^Change the expiry of office")).click()
    dialog = page.locator("#expiry-dialog")
    assert dialog.is_visible() and focused(page) == "expiry-choice"
    assert page.get_by_label("Date and time").is_hidden()  # only for "on a date…"
    page.get_by_label("Expires").select_option("86400")
    shot(page, "expiry", full_page=False)
    page.get_by_role("button", name="Save expiry").click()
    status(page).get_by_text(re.compile("now expires 2")).wait_for()
    assert dialog.is_hidden() and "expires 2" in row_of(page, "printer").inner_text()
    with Shelf.open(served.db, embedder=None) as shelf:
        expires = shelf.get(owner, memory.id).expires_at
        assert expires is not None and 86000 < (expires - shelf.now()).total_seconds() <= 86400

    page.get_by_role("button", name=re.compile("^Change the expiry of office")).click()
    page.get_by_label("Expires").select_option("date")
    page.get_by_label("Date and time").fill("2001-01-01T09:00")
    page.get_by_role("button", name="Save expiry").click()
    dialog.get_by_text("That time has already passed: pick a later one, or choose never.").wait_for()
    assert focused(page) == "expiry-date" and dialog.is_visible()
    page.get_by_label("Expires").select_option("never")
    page.get_by_role("button", name="Save expiry").click()
    status(page).get_by_text("now never expires").wait_for()
    with Shelf.open(served.db, embedder=None) as shelf:
        assert shelf.get(owner, memory.id).expires_at is None


def test_a_list_that_answers_late_does_not_speak_over_the_tab_shown(page: Any, served: Served) -> None:
    """The memories are asked for, the Facts tab is chosen before they come, the facts come first: the status line
    keeps saying what the Facts tab shows when the memories arrive."""
    seed(served, USER, ("home", "Kaleb lives in Porto."))
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.set_fact(Owner(TENANT, USER), "user_name", "Kaleb")
    held: list[Any] = []
    memories = re.compile(r"/v1/users/[^/]+/memories\?")
    page.route(memories, lambda route: held.append(route))  # answered when the test says
    open_as(page, served, USER)
    page.get_by_role("button", name="Show memories").click()
    while not held:
        page.wait_for_timeout(20)
    page.get_by_role("tab", name="Facts").click()
    status(page).get_by_text("1 fact, most recently set first").wait_for()
    held[0].continue_()
    page.wait_for_function("() => document.querySelectorAll('#rows tr').length === 1")
    page.wait_for_timeout(200)
    assert "1 fact, most recently set first" in status(page).inner_text()
    page.unroute(memories)
    page.get_by_role("tab", name="Memories").click()  # asks again, and this answer speaks
    status(page).get_by_text("1 memory shown").wait_for()


def test_facts_show_their_history_and_are_corrected_or_deleted(page: Any, served: Served) -> None:
    seed(served, USER)
    owner = Owner(TENANT, USER)
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.set_fact(owner, "user_name", "Kal", "mined")
        shelf.set_fact(owner, "user_name", "Kaleb")
        shelf.set_fact(owner, "user_name", "K. the guess", "inferred")  # weaker: history only
        shelf.set_fact(owner, "home_city", "Porto")
    open_as(page, served, USER)
    show_memories(page, 0)
    page.get_by_role("tab", name="Facts").click()
    status(page).get_by_text("2 facts, most recently set first").wait_for()
    page.get_by_role("button", name="Show the history of user_name").click()
    timeline = page.locator("ol.timeline")
    timeline.wait_for()
    assert [line.split(" · ", 1)[1] for line in timeline.locator("li").all_inner_texts()] == [
        "inferred · K. the guess (kept in history only: a weaker source)", "stated · Kaleb (current)",
        "mined · Kal"]
    shot(page, "facts")

    page.get_by_role("button", name="Correct home_city").click()
    assert focused(page) == "fact-value"
    page.get_by_label("New value of home_city").fill("   ")
    page.get_by_role("button", name="Save value").click()
    page.locator("#fact-dialog").get_by_text("Type the new value, or Cancel to keep “Porto”.").wait_for()
    page.get_by_label("New value of home_city").fill("Lisbon")
    page.get_by_role("button", name="Save value").click()
    status(page).get_by_text("home_city is now “Lisbon”; “Porto” stays in its history.").wait_for()
    with Shelf.open(served.db, embedder=None) as shelf:
        assert shelf.get_fact(owner, "home_city").value == "Lisbon"

    asked = answer_dialogs(page, accept=True)
    page.get_by_role("button", name="Delete user_name").click()
    status(page).get_by_text("Deleted the fact user_name.").wait_for()
    assert len(asked) == 1 and "user_name" in asked[0] and "cannot be undone" in asked[0]
    with Shelf.open(served.db, embedder=None) as shelf:
        assert [f.key for f in shelf.facts(owner)] == ["home_city"]
    assert page.locator("#fact-rows tr").count() == 1


def test_a_fact_named_dot_dot_is_never_asked_for_so_its_user_stays(page: Any, served: Served,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A browser reads "..", even escaped, as the folder above: deleting a fact so named (kept from before memshelf
    refused the name) would have sent DELETE /v1/users/{user} and erased the whole user. The page says why it will
    not, and sends nothing."""
    seed(served, USER, ("network", PRINTER))
    owner = Owner(TENANT, USER)
    with monkeypatch.context() as older, Shelf.open(served.db, embedder=None) as shelf:
        older.setattr(model, "addressable", lambda kind, value: value)
        shelf.set_fact(owner, "..", "a key an older version took")
    open_as(page, served, USER)
    show_memories(page, 1)
    page.get_by_role("tab", name="Facts").click()
    status(page).get_by_text("1 fact, most recently set first").wait_for()
    asked = answer_dialogs(page, accept=True)
    page.get_by_role("button", name="Delete ..").click()
    status(page).get_by_text("A browser cannot ask for “..”: URLs read it as a step in their path. Use the Python "
                             "library for it").wait_for()
    shot(page, "fact-dot-dot")
    assert len(asked) == 1
    with Shelf.open(served.db, embedder=None) as shelf:
        assert [m.content for m in shelf.list_memories(owner)[0]] == [PRINTER]
        assert [f.key for f in shelf.facts(owner)] == [".."]
        shelf.forget_fact(owner, "..")


def test_messages_by_thread_link_to_what_was_learned_from_them(page: Any, served: Served) -> None:
    seed(served, USER)
    owner = Owner(TENANT, USER)
    with Shelf.open(served.db, embedder=None) as shelf:
        for n in range(3):
            shelf.log_message(owner, "chat-2", "user", f"Small talk number {n}.")
        said = shelf.log_message(owner, "chat-1", "user", "I'm allergic to peanuts.")
        shelf.log_message(owner, "chat-1", "assistant", "Noted.")
        shelf.learn(owner, thread="chat-1")
    open_as(page, served, USER)
    show_memories(page, 1)
    learned = row_of(page, "peanuts")
    assert "Learned from" in learned.inner_text()
    learned.get_by_role("button", name=re.compile("^Show the message in thread chat-1")).click()
    status(page).get_by_text("in “chat-1”, newest first, by thread").wait_for()
    message = page.locator(f"#message-{said.id}")
    assert focused(page) == f"message-{said.id}" and "highlight" in (message.get_attribute("class") or "")
    assert "Taught: “The user is allergic to peanuts.”" in message.inner_text()
    shot(page, "messages")

    page.get_by_label("Thread", exact=True).fill("")
    page.get_by_role("button", name="Show messages").click()
    status(page).get_by_text("5 messages, newest first, by thread").wait_for()
    assert page.locator(".thread h3").all_inner_texts() == ["Thread chat-1", "Thread chat-2"]
    page.get_by_role("button", name="Show only the thread chat-2").click()
    status(page).get_by_text("3 messages in “chat-2”").wait_for()


def test_search_shows_why_each_line_was_found(page: Any, served: Served) -> None:
    seed(served, USER, ("office", PRINTER), ("office", "The printer toner is in the supply closet.", "inferred"))
    open_as(page, served, USER)
    show_memories(page, 2)
    search_for(page, "printer toner")
    page.get_by_text("2 hits (keyword), best first").wait_for()
    why = page.locator("#hit-rows td.why").all_inner_texts()
    assert why[0].startswith("By words: rank 1, bm25 ") and why[1].startswith("By words: rank 2, bm25 ")
    assert_fits(page, "search")
    shot(page, "search")
    page.get_by_label("Question").fill("   ")
    page.get_by_role("button", name="Search", exact=True).click()
    status(page).get_by_text("Type something to search for").wait_for()
    assert "question" not in status(page).inner_text() and focused(page) == "question"


def test_export_downloads_the_user_as_json_lines(page: Any, served: Served) -> None:
    seed(served, USER, ("office", PRINTER))
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.set_fact(Owner(TENANT, USER), "user_name", "Kaleb")
    open_as(page, served, USER)
    show_memories(page, 1)
    with page.expect_download() as download:
        page.get_by_role("button", name="Export as JSON Lines").click()
    saved = download.value
    assert saved.suggested_filename == f"memshelf-{USER}.jsonl"
    lines = [json.loads(line) for line in Path(saved.path()).read_text(encoding="utf-8").splitlines()]
    assert [r["kind"] for r in lines] == ["memshelf-export", "memory", "fact", "fact_change"]
    assert lines[1]["content"] == PRINTER
    status(page).get_by_text(f"Exported {USER}: 3 records in memshelf-{USER}.jsonl").wait_for()


def test_erasing_the_user_leaves_a_receipt_and_nothing_of_them_on_the_page(page: Any, served: Served) -> None:
    seed(served, USER, *[("note", f"Note number {n}.") for n in range(55)])
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.set_fact(Owner(TENANT, USER), "user_name", "Kaleb")
        shelf.log_message(Owner(TENANT, USER), "t1", "user", "Hello.")
    open_as(page, served, USER)
    show, more = page.get_by_role("button", name="Show memories"), page.get_by_role("button", name="More", exact=True)
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
    status(page).get_by_text(re.compile(r"Erased .*55 memories, 1 fact, 1 message")).wait_for()
    assert len(asked) == 1 and USER in asked[0]
    receipt = page.locator("#receipt")
    assert receipt.is_visible() and focused(page) == "receipt"
    counts = dict(zip(receipt.locator("dt").all_inner_texts(), receipt.locator("dd").all_inner_texts()))
    assert counts == {"Memories": "55", "Facts": "1", "Fact history entries": "1", "Messages": "1"}
    assert page.locator("#rows tr").count() == 0 and page.locator("#user-panel").is_hidden()
    assert stored_topics(served, USER) == []
    shot(page, "erased")
    show.click()
    page.get_by_text(f"{USER} has no memories here").wait_for()
    assert page.locator("#results").is_hidden() and receipt.is_hidden()


def test_an_erasure_whose_scrub_is_left_for_later_says_so_on_its_receipt(page: Any, served: Served) -> None:
    """Another connection reading the file holds up SQLite's scrub: the receipt says a copy may stay until the next
    scrub, and how to run it."""
    seed(served, USER, ("note", "The safe word is xylophagous."))
    open_as(page, served, USER)
    show_memories(page, 1)
    reader = sqlite3.connect(served.db, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM memories").fetchone()
    try:
        answer_dialogs(page, accept=True)
        page.get_by_role("button", name="Erase this user").click()
        status(page).get_by_text(re.compile(r"Erased .*1 memory")).wait_for()
        scrub = page.locator("#receipt-scrub")
        assert scrub.is_visible()
        assert "until the next scrub" in scrub.inner_text() and "memshelf scrub" in scrub.inner_text()
        shot(page, "erased-scrub-pending")
    finally:
        reader.close()


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("which", ["wrong", "admin"])
def test_a_key_that_cannot_read_says_what_to_do(page: Any, served: Served, which: str) -> None:
    key, says = {"wrong": ("ms_not_a_real_key", "This API key is wrong or revoked"),
                 "admin": (served.admin, "This is an admin key")}[which]
    for button in ["Show memories", "List users"]:
        open_as(page, served, USER, key=key)
        page.get_by_role("button", name=button).click()
        status(page).get_by_text(says).wait_for()
        assert "memshelf keys create --tenant NAME" in status(page).inner_text()
        assert "Authorization" not in status(page).inner_text()  # the page's terms, not the HTTP API's
        assert "error" in (status(page).get_attribute("class") or "") and focused(page) == "key"


def test_a_server_that_does_not_answer_is_a_sentence_on_the_page(page: Any, served: Served) -> None:
    open_as(page, served, USER)
    page.route("**/v1/**", lambda route: route.abort())  # as when memshelf serve has stopped
    page.get_by_role("button", name="Show memories").click()
    status(page).get_by_text("The server did not answer: check that memshelf serve is still").wait_for()


def test_a_missing_key_or_user_asks_for_it(page: Any, served: Served) -> None:
    page.goto(served.url + "/")
    for button in ["Show memories", "List users"]:
        page.get_by_role("button", name=button).click()
        status(page).get_by_text("Paste an API key first").wait_for()
        assert focused(page) == "key"
    page.get_by_label("API key").fill(served.secret)
    page.get_by_role("button", name="Show memories").click()
    status(page).get_by_text("Type the user's id first, or press List users to pick one.").wait_for()
    assert "endpoint" not in status(page).inner_text() and focused(page) == "user"
    assert page.get_by_label("User", exact=True).get_attribute("aria-invalid") == "true"


def test_another_user_or_key_clears_what_is_shown(page: Any, served: Served) -> None:
    seed(served, USER, *[("note", f"Note number {n}.") for n in range(51)])
    for field in ["User", "API key"]:
        open_as(page, served, USER)
        page.get_by_role("button", name="Show memories").click()
        page.get_by_text("50 memories shown").wait_for()
        page.get_by_label(field, exact=True).fill("ana" if field == "User" else "ms_another_key")
        assert page.locator("#rows tr").count() == 0 and page.locator("#user-panel").is_hidden()
        assert status(page).inner_text() == ""


def test_forget_asks_first_and_dismissing_keeps_the_memory(page: Any, served: Served) -> None:
    seed(served, USER, ("office", PRINTER))
    open_as(page, served, USER)
    show_memories(page, 1)
    asked = answer_dialogs(page, accept=False)
    page.get_by_role("button", name=re.compile("^Forget office")).click()
    page.evaluate("1")  # a round trip: the confirm, if any, has been answered
    assert len(asked) == 1 and PRINTER in asked[0] and "cannot be undone" in asked[0]
    assert stored_topics(served, USER) == ["office"]
    assert page.locator("#rows tr").count() == 1 and "Forgot" not in status(page).inner_text()


def test_forgetting_a_memory_forgotten_elsewhere_just_removes_its_row(page: Any, served: Served) -> None:
    printer, tomatoes = seed(served, USER, ("office", PRINTER), ("garden", TOMATOES))
    open_as(page, served, USER)
    show_memories(page, 2)
    with Shelf.open(served.db, embedder=None) as shelf:
        shelf.forget(Owner(TENANT, USER), printer.id)
    answer_dialogs(page, accept=True)
    page.get_by_role("button", name=re.compile("^Forget office")).click()
    page.get_by_text(f"Already forgotten: “{PRINTER}”").wait_for()
    assert page.locator("#rows tr").count() == 1 and focused(page).startswith("Change the expiry of garden")
    assert stored_topics(served, USER) == ["garden"]


# ---------------------------------------------------------------------------------------------- layout, keyboard
def test_the_page_fits_the_screen(page: Any, served: Served) -> None:
    seed(served, USER, ("a-topic-without-any-spaces-" * 4, f"Read {LONG_LINK}", "mined"), ("office", PRINTER))
    page.goto(served.url + "/")
    assert_fits(page, "empty")
    shot(page, "empty")
    open_as(page, served, USER)
    page.get_by_role("button", name="Show memories").click()
    page.get_by_text("2 memories shown").wait_for()
    assert_fits(page, "memories")
    shot(page, "long-lines")
    for tab in ["Facts", "Messages"]:
        page.get_by_role("tab", name=tab).click()
        assert_fits(page, tab)
    page.get_by_label("User", exact=True).fill("")
    page.get_by_role("button", name="Show memories").click()
    page.get_by_text("Type the user's id first").wait_for()
    assert_fits(page, "error")
    shot(page, "error")


def tab_to(page: Any, expected: str, key: str = "Tab") -> None:
    """Press a key (Tab); the focus lands on `expected` (an id, or the start of a label) and shows a ring."""
    page.keyboard.press(key)
    assert focused(page).startswith(expected), focused(page)
    ring = page.evaluate("(() => { const s = getComputedStyle(document.activeElement); "
                         "return [s.outlineStyle, parseFloat(s.outlineWidth)]; })()")
    assert ring[0] != "none" and ring[1] >= 2, f"no visible focus on {expected}: {ring}"


def test_the_keyboard_alone_opens_searches_confirms_and_forgets(page: Any, served: Served) -> None:
    seed(served, USER, ("office", PRINTER, "inferred"), ("garden", TOMATOES))
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
    for expected in ["load", "list-users", "export", "forget-user", "tab-memories", "f-topic", "f-source",
                     "f-contains", "f-order", "f-superseded", "apply", "Change the expiry of garden",
                     "Forget garden", "Confirm office"]:
        tab_to(page, expected)
    keyboard.press("Enter")
    status(page).get_by_text("Confirmed").wait_for()
    assert focused(page).startswith("Change the expiry of office")

    page.locator("#tab-memories").focus()
    tab_to(page, "tab-facts", "ArrowRight")
    tab_to(page, "tab-messages", "ArrowRight")
    tab_to(page, "tab-search", "ArrowRight")
    tab_to(page, "question")
    keyboard.type("printer")
    keyboard.press("Enter")
    page.get_by_text("1 hit (keyword)").wait_for()
    tab_to(page, "search")
    tab_to(page, "Forget office")
    shot(page, "keyboard")
    asked = answer_dialogs(page, accept=True)
    keyboard.press("Enter")
    status(page).get_by_text("Forgot").wait_for()
    assert len(asked) == 1 and stored_topics(served, USER) == ["garden"]
    assert focused(page) == "question"


def test_search_by_meaning_shows_both_retrievers_working(browser: Any, tmp_path: Path) -> None:
    """With the server's local model, a hit found by words and by meaning shows both ranks and scores, and one
    found by meaning alone says so."""
    db = tmp_path / "meaning.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key(TENANT, "browser")[1]
    with serving(db, "local") as url:
        for content in ["The printer toner is in the supply closet.", "I use a standing desk at work.",
                        "Spare ink cartridges sit on the top shelf."]:
            answer = httpx.post(f"{url}/v1/users/{USER}/memories", json={"topic": "office", "content": content},
                                headers={"Authorization": f"Bearer {secret}"}, timeout=120)
            assert answer.status_code == 201, answer.text
        context = browser.new_context(viewport={"width": WIDTHS["desktop"][0], "height": WIDTHS["desktop"][1]})
        try:
            page = context.new_page()
            page.width_name = "desktop"
            page.goto(url + "/")
            page.get_by_label("API key").fill(secret)
            page.get_by_label("User", exact=True).fill(USER)
            show_memories(page, 3)
            search_for(page, "Where is the printer toner?")
            status(page).get_by_text(re.compile(r"hits? \(hybrid\), best first")).wait_for(timeout=120_000)
            why = dict(zip(page.locator("#hit-rows .content").all_inner_texts(),
                           page.locator("#hit-rows td.why").all_inner_texts()))
            toner = why["The printer toner is in the supply closet."]
            assert re.fullmatch(r"By words and meaning: words rank 1 \(bm25 [0-9.e-]+\); meaning rank 1 "
                                r"\(cosine 0\.\d{3}\); fused score [0-9.e-]+", toner), toner
            by_meaning = [text for text in why.values() if text.startswith("By meaning: rank ")]
            assert by_meaning and all(re.search(r"cosine 0\.\d{3}$", text) for text in by_meaning), why
            shot(page, "search-by-meaning")
        finally:
            context.close()


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
