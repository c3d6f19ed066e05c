"""The memshelf command, run as a real process: verbs, --json, env settings, and one-line errors."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from memshelf import Owner, Shelf


def run(tmp_path, *args, env=None, input=None):
    environment = {**os.environ, "MEMSHELF_DB": str(tmp_path / "memory.db"), "MEMSHELF_TENANT": "home",
                   "MEMSHELF_USER": "kaleb", "MEMSHELF_EMBEDDER": "none", "NO_COLOR": "1", "COLUMNS": "200",
                   **(env or {})}
    return subprocess.run([sys.executable, "-m", "memshelf.cli", *args], capture_output=True, text=True,
                          env=environment, input=input, timeout=120)


def ok(tmp_path, *args, **kw):
    proc = run(tmp_path, *args, **kw)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_python_dash_m_memshelf_is_the_same_command(tmp_path):
    """`python -m memshelf` works where the script is not on PATH; it writes and reads the same shelf."""
    ok(tmp_path, "set-fact", "user_name", "Kaleb")
    environment = {**os.environ, "MEMSHELF_DB": str(tmp_path / "memory.db"), "MEMSHELF_TENANT": "home",
                   "MEMSHELF_USER": "kaleb", "MEMSHELF_EMBEDDER": "none", "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "memshelf", "--json", "facts"], capture_output=True, text=True,
                          env=environment, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [(f["key"], f["value"]) for f in json.loads(proc.stdout)] == [("user_name", "Kaleb")]
    failed = subprocess.run([sys.executable, "-m", "memshelf", "forget", "m_0123456789abcdef"], capture_output=True,
                            text=True, env=environment, timeout=120)
    assert failed.returncode == 1 and failed.stderr.startswith("error:")  # main()'s one-line errors, not a traceback


def test_remember_search_context_prompt(tmp_path):
    ok(tmp_path, "remember", "network", "The office printer is on 192.168.1.40.")
    ok(tmp_path, "remember", "network", "The printer jams on thick paper.", "--source", "mined")
    found = ok(tmp_path, "search", "printer")
    lines = [line.strip() for line in found.stdout.splitlines() if line.strip()]
    assert lines == ["1.0  [network]  The office printer is on 192.168.1.40.",
                     "0.6  [network]  The printer jams on thick paper."]
    assert "keyword search only" in found.stderr
    assert ok(tmp_path, "context", "What did I say the printer's address was?").stdout == (
        "Relevant knowledge (confidence in brackets, 1.0 means the user said so):\n"
        "  - [1.0] The office printer is on 192.168.1.40.\n"
        "  - [0.6] The printer jams on thick paper.\n")
    assert ok(tmp_path, "context", "How was your day?").stdout == ""
    ok(tmp_path, "set-fact", "user_name", "Kaleb")
    prompt = ok(tmp_path, "prompt", "You are GLaDOS.", "printer address?").stdout
    assert prompt.startswith("You are GLaDOS.\n\nMemory context:\nKnown facts about the user:\n  - user_name: Kaleb")


def test_json_output_and_explain(tmp_path):
    memory = json.loads(ok(tmp_path, "--json", "remember", "network", "The printer jams.").stdout)
    assert memory["content"] == "The printer jams." and memory["confidence"] == 1.0
    result = json.loads(ok(tmp_path, "--json", "search", "printer").stdout)
    assert result["mode"] == "keyword" and result["degraded"] is False
    assert [h["memory"]["id"] for h in result["hits"]] == [memory["id"]]
    explained = ok(tmp_path, "search", "printer", "--explain").stdout
    assert "keyword" in explained and memory["id"] in explained


def test_forget_and_isolation_by_owner(tmp_path):
    memory = json.loads(ok(tmp_path, "--json", "remember", "t", "secret plan").stdout)
    stranger = run(tmp_path, "forget", memory["id"], env={"MEMSHELF_USER": "maya"})
    assert stranger.returncode == 1 and "no memory" in stranger.stderr
    assert "secret plan" in ok(tmp_path, "search", "plan").stdout
    ok(tmp_path, "forget", memory["id"])
    assert ok(tmp_path, "search", "plan").stdout.strip() == ""


def test_export_import_round_trip(tmp_path):
    ok(tmp_path, "remember", "network", "The printer jams.")
    ok(tmp_path, "set-fact", "user_name", "Kaleb")
    dump = tmp_path / "kaleb.jsonl"
    ok(tmp_path, "export", "--out", str(dump))
    counts = json.loads(ok(tmp_path, "--json", "--user", "maya", "import", str(dump)).stdout)
    assert counts == {"memories": 1, "facts": 1, "messages": 0}
    again = ok(tmp_path, "export", env={"MEMSHELF_USER": "maya"}).stdout
    assert again == dump.read_text()
    lines = dump.read_text().splitlines()
    broken = tmp_path / "broken.jsonl"  # errors name the file's line, blank lines counted
    broken.write_text("\n".join([lines[0], "", lines[1], '{"kind": "memory", "id": "m_1"}', *lines[2:]]) + "\n")
    assert "line 4 of" in run(tmp_path, "--user", "ines", "import", str(broken)).stderr
    broken.write_text("\n".join([lines[0], "", "{not json"]) + "\n")
    assert "line 3 of" in run(tmp_path, "--user", "ines", "import", str(broken)).stderr


def test_forget_user_purge_and_facts_history(tmp_path):
    ok(tmp_path, "set-fact", "user_name", "Kal")
    ok(tmp_path, "set-fact", "user_name", "Kaleb")
    history = json.loads(ok(tmp_path, "--json", "facts", "--history", "user_name").stdout)
    assert [h["value"] for h in history] == ["Kal", "Kaleb"]
    ok(tmp_path, "remember", "t", "short lived", "--ttl", "0.001")
    assert "purged 1 memory, 0 messages" in ok(tmp_path, "purge").stdout
    erased = json.loads(ok(tmp_path, "--json", "forget-user", "--yes").stdout)
    assert erased["facts"] == 1 and erased["fact_changes"] == 2


def test_keys(tmp_path):
    created = json.loads(ok(tmp_path, "--json", "keys", "create", "--tenant", "acme", "--name", "ci").stdout)
    assert created["secret"].startswith("ms_") and created["key"]["tenant"] == "acme"
    listed = ok(tmp_path, "keys", "list").stdout
    assert created["key"]["id"] in listed and created["secret"] not in listed
    assert json.loads(ok(tmp_path, "--json", "keys", "revoke", created["key"]["id"]).stdout) == {
        "revoked": created["key"]["id"]}
    assert "revoked" in ok(tmp_path, "keys", "list").stdout
    admin = json.loads(ok(tmp_path, "--json", "keys", "create", "--admin").stdout)  # MEMSHELF_TENANT is set here
    assert admin["key"]["tenant"] is None
    assert "not both" in run(tmp_path, "keys", "create", "--admin", "--tenant", "acme").stderr


@pytest.mark.parametrize("args,needle", [
    (["remember", "t", ""], "empty"),
    (["remember", "t", "x", "--source", "gossip"], "--sources gossip=0.8"),
    (["search", "printer", "--limit", "0"], "limit"),
    (["search", "printer", "--mode", "semantic"], "needs an embedder"),
    (["forget", "m_0000"], "no memory"),
    (["forget-message", "msg_0123456789abcdef"], "list them with `memshelf messages`"),
    (["forget-message", "m_0000"], "list them with `memshelf messages`"),
    (["import", "/nonexistent/file.jsonl"], "cannot read"),
    (["backfill"], "needs an embedder"),
    (["learn"], "--thread"),
    (["learn", "--thread", "t1", "--extractor", "psychic"], "--extractor psychic: unknown extractor"),
    (["learn", "/nonexistent/turns.jsonl"], "cannot read"),
])
def test_errors_are_one_line_without_traceback(tmp_path, args, needle):
    proc = run(tmp_path, *args)
    assert proc.returncode != 0
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_missing_owner_says_what_to_do(tmp_path):
    proc = run(tmp_path, "search", "printer", env={"MEMSHELF_TENANT": ""})
    assert proc.returncode == 1 and "--tenant" in proc.stderr


def test_every_command_has_help(tmp_path):
    """The command's own help from a real process once (every command listed); each command's help in this
    process (a process each took 25 s of the suite)."""
    from typer.testing import CliRunner

    from memshelf.cli import app

    names = ["remember", "search", "context", "prompt", "facts", "set-fact", "forget", "forget-user", "purge",
             "export", "import", "backfill", "migrate", "serve", "mcp", "demo", "keys", "log", "messages", "learn",
             "forget-thread", "forget-message", "list", "get", "forget-fact", "forget-tenant", "stats", "users"]
    listing = ok(tmp_path, "--help").stdout
    assert "Usage" in listing and all(name in listing for name in names)
    runner = CliRunner()
    for name in names:
        result = runner.invoke(app, [name, "--help"], env={"NO_COLOR": "1", "COLUMNS": "200"})
        assert result.exit_code == 0 and "Usage" in result.output and len(result.output) > 100, (name, result.output)


def test_demo_without_an_embedder_says_so(tmp_path):
    proc = ok(tmp_path, "demo")
    assert "0.4  [network] The printer might be on the guest network." in proc.stdout
    assert "['printer', 'address']" in proc.stdout
    assert "keyword search only" in proc.stdout


def test_demo_ends_with_learning_a_conversation_and_a_move(tmp_path):
    scene = ok(tmp_path, "demo").stdout.split("$ log a conversation", 1)[1]
    first, rest = scene.split("$ one more turn", 1)
    second, known = rest.split("$ the facts now", 1)
    assert rows_of(first) == [["skip", "mined", "user_name = Kaleb"],  # the introduction: already known
                              ["set_fact", "mined", "home_city = Porto"],
                              ["remember", "mined", "health: The user is allergic to peanuts."]]
    assert rows_of(second) == [["set_fact", "mined", "home_city = Lisbon"]]
    assert "fact   home_city = Lisbon (mined)" in known and "fact   user_name = Kaleb (stated)" in known
    assert "memory [health] The user is allergic to peanuts. (mined, 0.6)" in known
    assert "home_city history: Porto -> Lisbon" in known


@pytest.mark.slow
def test_demo_with_the_local_model_searches_by_meaning(tmp_path):
    proc = ok(tmp_path, "demo", env={"MEMSHELF_EMBEDDER": "local"})
    meaning = proc.stdout.split("search by meaning", 1)[1]
    first_hit = meaning.splitlines()[1].split(None, 1)[1]
    assert first_hit == "The printer jams on thick paper."
    assert "coffee maker at 07:00." not in meaning.split("(the coffee maker", 1)[0]


def test_migrate_copies_and_verifies(tmp_path):
    ok(tmp_path, "remember", "network", "The printer jams.")
    ok(tmp_path, "set-fact", "user_name", "Kaleb")
    dest = tmp_path / "copy.db"
    report = json.loads(ok(tmp_path, "--json", "migrate", str(tmp_path / "memory.db"), str(dest)).stdout)
    assert report["owners"] == 1 and report["copied"]["memories"] == 1
    assert ok(tmp_path, "export").stdout == ok(tmp_path, "export", env={"MEMSHELF_DB": str(dest)}).stdout
    same = run(tmp_path, "migrate", str(dest), str(dest))
    assert same.returncode == 1 and "two different stores" in same.stderr
    relative = subprocess.run([sys.executable, "-m", "memshelf.cli", "migrate", "copy.db", "./copy.db"], cwd=tmp_path,
                              capture_output=True, text=True, env={**os.environ, "MEMSHELF_EMBEDDER": "none"})
    assert relative.returncode == 1 and "two different stores" in relative.stderr  # one file, two spellings
    ok(tmp_path, "--user", "ana", "remember", "home", "Ana lives in Porto.")
    listed = json.loads(ok(tmp_path, "--json", "--user", "ana", "list").stdout)["memories"]
    with Shelf.open(tmp_path / "memory.db", embedder=None) as shelf:  # superseded by hand: no verb does it
        newer = shelf.remember(Owner("home", "ana"), "home", "Ana lives in Lisbon.")
        shelf.store.supersede_memory(Owner("home", "ana"), listed[0]["id"], newer.id, shelf.now())
    shown = ok(tmp_path, "--user", "ana", "list", "--superseded").stdout
    assert f"Ana lives in Porto. (superseded by {newer.id} on " in shown


# ---------------------------------------------------------------- learning
HELLO = ("Hi, I'm Kaleb.", "I live in Porto.", "I'm allergic to peanuts.")


def rows_of(table: str) -> list[list[str]]:
    """The op, source and what of each row of a printed plan (the why column wraps, so it is left out)."""
    rows = []
    for line in table.splitlines():
        cells = line.strip().split("  ")
        if cells[0] in ("set_fact", "remember", "supersede", "skip"):
            rows.append([cell.strip() for cell in cells if cell.strip()][:3])
    return rows


def test_learn_a_logged_thread_previews_applies_and_adds_nothing_twice(tmp_path, target):
    def cli(*args):
        return ok(tmp_path, "--db", target, *args)

    said = [cli("log", "t1", "user", content).stdout.strip() for content in HELLO]
    said.append(cli("log", "t1", "assistant", "Noted: you live in Madrid.").stdout.strip())  # says nothing of the user

    preview = cli("learn", "--thread", "t1", "--dry-run").stdout
    assert rows_of(preview) == [["set_fact", "mined", "user_name = Kaleb"], ["set_fact", "mined", "home_city = Porto"],
                                ["remember", "mined", "health: The user is allergic to peanuts."]]
    assert "would apply 3, skipped 0, no watermark" in preview and "nothing written" in preview
    assert json.loads(cli("--json", "facts").stdout) == []
    assert "no matches" in run(tmp_path, "--db", target, "search", "peanuts").stderr

    plan = json.loads(cli("learn", "--thread", "t1", "--json").stdout)
    assert plan["thread"] == "t1" and plan["extractor"] == "rules" and plan["dry_run"] is False
    assert plan["messages"] == said and plan["watermark"] == said[-1]
    assert [(p["op"], p["key"], p["value"], p["source"], p["evidence"]) for p in plan["proposals"]] == [
        ("set_fact", "user_name", "Kaleb", "mined", [said[0]]), ("set_fact", "home_city", "Porto", "mined", [said[1]]),
        ("remember", None, None, "mined", [said[2]])]
    memory_id = plan["proposals"][2]["record"]
    assert sorted((f["key"], f["value"], f["source"]) for f in json.loads(cli("--json", "facts").stdout)) == [
        ("home_city", "Porto", "mined"), ("user_name", "Kaleb", "mined")]
    hits = json.loads(cli("--json", "search", "peanuts").stdout)["hits"]
    assert [(h["memory"]["id"], h["memory"]["content"]) for h in hits] == [
        (memory_id, "The user is allergic to peanuts.")]

    again = cli("learn", "--thread", "t1").stdout
    assert again.splitlines() == ["nothing to learn", f"applied 0, skipped 0, watermark {said[-1]}"]
    moved_id = cli("log", "t1", "user", "I moved to Lisbon last month.").stdout.strip()
    moved = json.loads(cli("--json", "learn", "--thread", "t1").stdout)
    assert moved["messages"] == [moved_id] and moved["watermark"] == moved_id
    assert [(p["op"], p["key"], p["value"]) for p in moved["proposals"]] == [("set_fact", "home_city", "Lisbon")]
    history = json.loads(cli("--json", "facts", "--history", "home_city").stdout)
    assert [h["value"] for h in history] == ["Porto", "Lisbon"]

    cli("set-fact", "favorite_color", "green")  # written by the caller: no thread's to erase
    erased = json.loads(cli("--json", "forget-thread", "t1", "--cascade").stdout)
    assert erased == {"memories": 1, "facts": 2, "fact_changes": 3, "messages": 5,
                      "scrub_pending": target.startswith(("postgres://", "postgresql://"))}  # queued there
    assert [f["key"] for f in json.loads(cli("--json", "facts").stdout)] == ["favorite_color"]
    assert json.loads(cli("--json", "search", "peanuts").stdout)["hits"] == []


def test_forget_says_when_the_scrub_is_left_for_later_and_scrub_finishes_it(tmp_path, target):
    """PostgreSQL queues an erasure's scrub (MEMSHELF_PG_SCRUB=off here, so no background scrub runs it); SQLite
    scrubs in the erasure. `memshelf scrub` finishes what is left, and then nothing is."""
    def cli(*args):
        return ok(tmp_path, "--db", target, *args, env={"MEMSHELF_PG_SCRUB": "off"})

    later = target.startswith(("postgres://", "postgresql://"))
    memory_id = json.loads(cli("--json", "remember", "secrets", "The vault word is xanthopsia.").stdout)["id"]
    said = cli("forget", memory_id).stdout
    assert said.startswith(f"forgot {memory_id}") and ("memshelf scrub" in said) == later
    assert json.loads(cli("--json", "scrub").stdout) == {"scrub_pending": False}
    assert cli("scrub").stdout.startswith("scrubbed")
    memory_id = json.loads(cli("--json", "remember", "secrets", "The gate word is quillwort.").stdout)["id"]
    assert json.loads(cli("--json", "forget", memory_id).stdout) == {"forgotten": memory_id, "scrub_pending": later}
    assert cli("scrub", "--full").stdout.startswith("scrubbed")
    assert json.loads(cli("--json", "search", "quillwort").stdout)["hits"] == []


def test_forget_thread_without_cascade_keeps_what_was_learned(tmp_path):
    ok(tmp_path, "log", "t2", "user", "I live in Porto.")
    ok(tmp_path, "learn", "--thread", "t2")
    assert ok(tmp_path, "forget-thread", "t2").stdout.startswith("erased 0 memories, 0 facts, 0 fact_changes, "
                                                                 "1 message")
    assert json.loads(ok(tmp_path, "--json", "messages", "t2").stdout) == []
    assert "home_city: Porto" in ok(tmp_path, "facts").stdout


def test_learn_from_a_file_prints_user_text_as_it_is(tmp_path):
    turns = tmp_path / "turns.jsonl"
    lines = [{"role": "user", "content": "Remember that the [b]x[/b] closing [/] tag matters.", "id": "m1",
              "at": "2026-05-01T09:30:00Z"},
             {"role": "assistant", "content": "I live in [red]Mars[/red]."}, {"role": "user", "content": "ok"}]
    turns.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    shown = ok(tmp_path, "learn", str(turns)).stdout
    assert "noted: The [b]x[/b] closing [/] tag matters" in shown and "Mars" not in shown
    assert "applied 1, skipped 0" in shown
    plan = json.loads(ok(tmp_path, "learn", str(turns), "--dry-run", "--json").stdout)
    assert [(p["op"], p["evidence"], p["reason"]) for p in plan["proposals"]] == [
        ("skip", ["m1"], "already remembered")]
    assert "[b]x[/b]" in ok(tmp_path, "search", "tag").stdout
    ok(tmp_path, "set-fact", "motto", "closing [/] tag")
    assert "motto: closing [/] tag" in ok(tmp_path, "facts").stdout


def test_an_unknown_extractor_creates_no_database(tmp_path):
    proc = run(tmp_path, "learn", "--thread", "t1", "--extractor", "psychic")
    assert proc.returncode == 1 and "registered extractors are ollama, openai, rules" in proc.stderr
    assert not (tmp_path / "memory.db").exists()


@pytest.mark.parametrize("content,needle", [
    ('{"role": "user", "content": "I live in Porto."}\n{"role": "user", "content": \n', "line 2 of"),
    ('["user", "I live in Porto."]\n', "line 1 of"),
    ('{"role": "user"}\n', "needs a string role and content"),
    ('{"role": "user", "content": "I live in Porto.", "at": "2026-05-01 09:30"}\n', "with a time zone"),
    ("\n\n", "holds no turns"),
    (b"\xff\xfe{}", "UTF-8"),
    ('{"role": "user", "content": "ok"}\n\n{"role": "human", "content": "I live in Porto."}\n', "line 3 of"),
    ('{"role": "user", "content": "I live in Porto.", "at": "2999-01-01T00:00:00Z"}\n', "line 1 of"),
    ('{"role": "user", "content": "I live in Porto.", "id": "a\\u0000b"}\n', "line 1 of"),
])
def test_a_bad_turns_file_is_one_line_naming_the_line(tmp_path, content, needle):
    turns = tmp_path / "turns.jsonl"
    turns.write_bytes(content if isinstance(content, bytes) else content.encode())
    proc = run(tmp_path, "learn", str(turns))
    assert proc.returncode == 1 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert json.loads(ok(tmp_path, "--json", "facts").stdout) == []


MARKUP = ["closing [/] tag", "[b]terse[/b]", "[red]alarm[/red]", "[link=http://x]y[/link]", ":smile: [/bold"]


@pytest.mark.parametrize("text", MARKUP)
def test_user_text_is_printed_as_typed_never_as_markup(tmp_path, text):
    """Rich markup in stored text is text: it is stored, printed unaltered by every verb that shows it, and later
    reads of the same user keep working."""
    ok(tmp_path, "set-fact", "note", text)
    ok(tmp_path, "remember", "notes", f"printer {text}")
    ok(tmp_path, "log", "red", "user", f"printer {text}")
    for _ in range(2):  # the second read is the one that used to crash, after the first stored the value
        assert f"note: {text}" in ok(tmp_path, "facts").stdout
    assert f"printer {text}" in ok(tmp_path, "search", "printer").stdout
    assert f"[red] user: printer {text}" in ok(tmp_path, "messages").stdout
    assert f"printer {text}" in ok(tmp_path, "context", "printer").stdout
    assert f"note: {text}" in ok(tmp_path, "prompt", "Base.", "printer").stdout


def test_a_key_for_a_markup_like_tenant_prints_its_secret(tmp_path):
    """The key is created before anything is printed: printing must not fail, or the secret is lost for good."""
    proc = ok(tmp_path, "keys", "create", "--tenant", "acme[/]")
    line, = proc.stdout.splitlines()
    assert line.split(": ")[0].endswith(" for tenant acme[/]") and line.split(": ")[1].startswith("ms_")
    assert "shown once" in proc.stderr
    assert "acme[/]" in ok(tmp_path, "keys", "list").stdout


def test_control_characters_never_reach_the_terminal(tmp_path):
    """An ANSI escape sequence or a bell stored in content is shown escaped in human output and kept exactly in
    --json output."""
    content = "printer \x1b[31mred\x1b[0m bell\x07 \x9b2J end\ttab"
    ok(tmp_path, "remember", "net\x1b[1m", content)
    ok(tmp_path, "set-fact", "color", "\x1b]0;title\x07")
    outputs = [ok(tmp_path, *verb).stdout for verb in (("search", "printer"), ("search", "printer", "--explain"),
                                                        ("context", "printer"), ("facts",), ("prompt", "B", "printer"))]
    for shown in outputs:
        assert not any(ch in shown for ch in "\x1b\x07\x9b"), shown
    assert "printer \\x1b[31mred\\x1b[0m bell\\x07 \\x9b2J end\ttab" in outputs[2]
    assert "color: \\x1b]0;title\\x07" in outputs[3]
    hits = json.loads(ok(tmp_path, "--json", "search", "printer").stdout)["hits"]
    assert hits[0]["memory"]["content"] == content


def test_help_shows_defaults_and_environment_variables(tmp_path):
    """Help is plain text: bracketed defaults and environment variables are not eaten as markup."""
    shown = ok(tmp_path, "--help").stdout
    assert "MEMSHELF_DATABASE_URL" in " ".join(shown.split()) and "default ./memshelf.db" in " ".join(shown.split())
    assert "<bool>" not in shown
    assert "[default: stated]" in " ".join(ok(tmp_path, "remember", "--help").stdout.split())


@pytest.mark.parametrize("args, usage", [
    (("remember",), "Usage: memshelf remember [OPTIONS] TOPIC CONTENT"),
    (("messages",), "Usage: memshelf messages [OPTIONS] [THREAD]"),
    (("keys", "revoke"), "Usage: memshelf keys revoke [OPTIONS] KEY_ID"),
])
def test_usage_lines_name_arguments_in_capitals(tmp_path, args, usage):
    """Arguments read as POSIX usage writes them, not as typer's `{topic}`, which looks like braces to type."""
    assert ok(tmp_path, *args, "--help").stdout.splitlines()[0] == usage


def test_log_names_the_roles_when_given_another(tmp_path):
    proc = run(tmp_path, "log", "kitchen", "human", "I live in Porto.")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "role 'human' is not one of user, assistant, system, developer, tool" in proc.stderr
    ok(tmp_path, "log", "kitchen", "User", "I live in Porto.")
    assert "[kitchen] user: I live in Porto." in ok(tmp_path, "messages").stdout


@pytest.mark.parametrize("args, says", [
    (("export", "--out", "/no/such/dir/x.jsonl"), "cannot write /no/such/dir/x.jsonl"),
    (("serve", "--port", "99999"), "--port 99999 is not a TCP port"),
    (("serve", "--workers", "0"), "--workers 0"),
    (("remember", "t", "c", "--ttl", "1e15"), "over the limit"),
])
def test_bad_options_are_one_line_errors_not_tracebacks(tmp_path, args, says):
    proc = run(tmp_path, *args)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_list_get_forget_fact_stats_and_forget_tenant(tmp_path):
    """The verbs a user reaches for after remembering: list with ids (paged), get one, forget a fact, count, and
    erase a whole tenant; each prints what it did and --json says the same."""
    for n in range(3):
        ok(tmp_path, "remember", "net", f"printer {n}")
    listed = ok(tmp_path, "list", "--limit", "2")
    lines = listed.stdout.splitlines()
    assert [line.split("] ")[-1] for line in lines] == ["printer 2", "printer 1"]
    assert "more: memshelf list --limit 2 --cursor " in listed.stderr
    cursor = listed.stderr.split("--cursor ")[1].strip()
    assert ok(tmp_path, "list", "--limit", "2", "--cursor", cursor).stdout.splitlines()[0].endswith("printer 0")
    ident = lines[0].split()[0]
    assert ok(tmp_path, "get", ident).stdout.strip() == lines[0]
    assert json.loads(ok(tmp_path, "--json", "get", ident).stdout)["content"] == "printer 2"

    ok(tmp_path, "set-fact", "user_name", "Kaleb")
    assert "forgot the fact user_name" in ok(tmp_path, "forget-fact", "user_name").stdout
    assert ok(tmp_path, "facts").stdout == ""
    assert run(tmp_path, "forget-fact", "user_name").returncode == 1

    block = ok(tmp_path, "context", "printer", "--limit", "1").stdout
    assert block.count("  - ") == 1
    counts = json.loads(ok(tmp_path, "--json", "stats").stdout)
    assert counts["memories"] == 3 and counts["facts"] == 0

    assert ok(tmp_path, "forget-tenant", "home", "--yes").stdout.startswith("erased 3 memories")
    assert json.loads(ok(tmp_path, "--json", "stats").stdout)["memories"] == 0
    assert ok(tmp_path, "list").stderr.strip() == "no memories"


def test_users_lists_the_tenants_users_with_counts_paged_and_filtered(tmp_path):
    ok(tmp_path, "remember", "net", "The printer jams.")
    ok(tmp_path, "set-fact", "user_name", "Kaleb")
    ok(tmp_path, "--user", "maya", "log", "t1", "user", "hello")
    ok(tmp_path, "--user", "max_b", "set-fact", "k", "v")
    ok(tmp_path, "--tenant", "elsewhere", "--user", "zoe", "set-fact", "k", "v")
    listed = ok(tmp_path, "users")
    assert [line.split(",")[0] for line in listed.stdout.splitlines()] == [
        "kaleb  1 memory", "max_b  0 memories", "maya  0 memories"]
    assert "1 fact, 0 messages, newest " in listed.stdout.splitlines()[0]
    first = ok(tmp_path, "users", "--limit", "1", "--contains", "MA")
    assert first.stdout.startswith("max_b  ")
    more = first.stderr.strip()
    assert more.startswith("more: memshelf users --limit 1 --contains MA --cursor ")
    rest = ok(tmp_path, *more.removeprefix("more: memshelf ").split())
    assert rest.stdout.startswith("maya  0 memories, 0 facts, 1 message")
    if rest.stderr:  # a full page of one: the command for the next, which holds no more
        last = ok(tmp_path, *rest.stderr.strip().removeprefix("more: memshelf ").split())
        assert last.stdout == "" and "no users" in last.stderr
    assert ok(tmp_path, "users", "--contains", "_").stdout.startswith("max_b  ")
    assert ok(tmp_path, "users", "--contains", "%").stderr.strip() == "no users whose id contains '%'"
    as_json = json.loads(ok(tmp_path, "--json", "users", "--tenant", "elsewhere").stdout)
    assert as_json == {"users": [{"user": "zoe", "memories": 0, "facts": 1, "messages": 0,
                                  "newest_at": as_json["users"][0]["newest_at"]}], "next_cursor": None}
    no_tenant = run(tmp_path, "users", env={"MEMSHELF_TENANT": ""})
    assert no_tenant.returncode == 1 and no_tenant.stderr.strip() == (
        "error: no tenant given: pass --tenant (or set MEMSHELF_TENANT)")
    bad = run(tmp_path, "users", "--cursor", "c1.nope")
    assert bad.returncode == 1 and "pass next_cursor unchanged" in bad.stderr


def test_memshelf_options_work_after_the_command(tmp_path):
    """Users and MCP client configs put --json, --db, --tenant and --user after the verb; a verb's own option of the
    same name (keys create --tenant, learn --json) keeps its meaning, and nothing after `--` is taken."""
    elsewhere = tmp_path / "other.db"
    env = {"MEMSHELF_TENANT": "", "MEMSHELF_USER": ""}
    ok(tmp_path, "remember", "net", "The printer jams.", "--db", str(elsewhere), "--tenant", "home", "--user", "kaleb",
       env=env)
    found = ok(tmp_path, "search", "printer", "--json", f"--db={elsewhere}", "--tenant", "home", "--user", "kaleb",
               env=env)
    assert [h["memory"]["content"] for h in json.loads(found.stdout)["hits"]] == ["The printer jams."]
    assert ok(tmp_path, "search", "printer").stdout == ""  # the default database was never written

    key = json.loads(ok(tmp_path, "keys", "create", "--tenant", "acme", "--json").stdout)["key"]
    assert key["tenant"] == "acme"

    stored = ok(tmp_path, "remember", "notes", "--", "--json")
    assert stored.stdout.rstrip().endswith("[notes] --json")

    missing = run(tmp_path, "search", "printer", "--db")
    assert missing.returncode == 1 and missing.stderr.startswith("error: --db needs a value")


WHAT_LOADED = """
import sys
from memshelf.cli import main
sys.argv = ["memshelf", *sys.argv[1:]]
try:
    main()
except SystemExit as end:
    code = end.code
print("loaded:", sorted(name for name in ("torch", "sentence_transformers", "transformers") if name in sys.modules),
      "exit:", code)
"""


@pytest.mark.parametrize("args", [
    ("facts",), ("list",), ("get", "m_0123456789abcdef"), ("forget", "m_0123456789abcdef"), ("forget-fact", "k"),
    ("export",), ("stats",), ("keys", "list"), ("messages",), ("forget-user", "--yes"), ("purge",), ("users",),
], ids=lambda args: " ".join(args))
def test_commands_that_need_no_embedding_never_load_the_model(tmp_path, args):
    """With the default (local) embedder configured, reading, listing, exporting and erasing take well under a
    second and no model: only remember, search, context, prompt, backfill and import embed."""
    pytest.importorskip("sentence_transformers")
    ok(tmp_path, "remember", "net", "The printer is on 10.0.0.1.")  # stored without a vector (embedder none)
    ok(tmp_path, "set-fact", "k", "v")
    environment = {**os.environ, "MEMSHELF_DB": str(tmp_path / "memory.db"), "MEMSHELF_TENANT": "home",
                   "MEMSHELF_USER": "kaleb", "NO_COLOR": "1"}
    environment.pop("MEMSHELF_EMBEDDER", None)
    proc = subprocess.run([sys.executable, "-c", WHAT_LOADED, *args], capture_output=True, text=True,
                          env=environment, timeout=120)
    assert proc.stdout.splitlines()[-1].startswith("loaded: [] exit:"), (proc.stdout, proc.stderr)


def test_list_filters_confirm_and_expire(tmp_path):
    ok(tmp_path, "remember", "network", "The printer is on 192.168.1.40.", "--source", "inferred")
    ok(tmp_path, "remember", "network", "The router is an ASUS.")
    ok(tmp_path, "remember", "food", "Kaleb likes green tea.", "--source", "mined")
    lines = ok(tmp_path, "list", "--order", "confident").stdout.splitlines()
    assert [line.split("] ", 2)[-1] for line in lines] == [
        "The router is an ASUS.", "Kaleb likes green tea.", "The printer is on 192.168.1.40."]
    paged = ok(tmp_path, "list", "--topic", "network", "--limit", "1")
    assert paged.stdout.endswith("The router is an ASUS.\n")
    assert "more: memshelf list --limit 1 --topic network --cursor c1." in paged.stderr
    # the command printed is the one typed, global options included: run as printed, it gives the next page
    ok(tmp_path, "--user", "ana", "--sources", "crm=0.5", "remember", "crm", "Ana called.", "--source", "crm")
    ok(tmp_path, "--user", "ana", "--sources", "crm=0.5", "remember", "crm", "Ana wrote.", "--source", "crm")
    first = ok(tmp_path, "--user", "ana", "--sources", "crm=0.5", "list", "--limit", "1", "--source", "crm")
    more = first.stderr.strip().removeprefix("more: ")
    assert more.startswith("memshelf --user ana --sources crm=0.5 list --limit 1 --source crm --cursor ")
    assert ok(tmp_path, *shlex.split(more)[1:]).stdout.endswith("Ana called.\n")
    assert ok(tmp_path, "list", "--contains", "TEA").stdout.endswith("Kaleb likes green tea.\n")
    guess = json.loads(ok(tmp_path, "--json", "list", "--source", "inferred").stdout)["memories"][0]
    confirmed = ok(tmp_path, "confirm", guess["id"])
    assert "[1.0] [network] The printer is on 192.168.1.40." in confirmed.stdout
    assert "was inferred" in confirmed.stderr
    assert json.loads(ok(tmp_path, "--json", "get", guess["id"]).stdout)["confirmed_from"] == "inferred"
    assert "expires 2" in ok(tmp_path, "expire", guess["id"], "--ttl", "3600").stderr
    assert "never expires" in ok(tmp_path, "expire", guess["id"], "--never").stderr
    bad = run(tmp_path, "expire", guess["id"])
    assert bad.returncode != 0 and "give --ttl SECONDS or --never" in bad.stderr
    unknown = run(tmp_path, "confirm", "m_0000000000000000")
    assert unknown.returncode == 1 and "memshelf list" in unknown.stderr and "Traceback" not in unknown.stderr


def test_search_on_a_large_shelf_finds_common_and_rare_words_as_ranking_every_match(tmp_path, monkeypatch):
    """A shelf grown past the keyword bound (a word in thousands of memories, SQLite): the command finds the newest
    matches of a common word, an old memory by its rarer word beside the common one, and a word found only in older
    memories than the newest thousand, exactly as ranking every match does."""
    from memshelf import Owner, Shelf
    from memshelf.stores import sqlite as sqlite_store

    kaleb = Owner("home", "kaleb")
    shelf = Shelf.open(tmp_path / "memory.db", embedder=None)
    shelf.remember(kaleb, "work", "The toner is in the supply closet, beside the printer.")
    shelf.remember_many(kaleb, [{"topic": "work", "content": f"Ticket {n}: the printer jams again."}
                                for n in range(2_500)])
    shelf.remember_many(kaleb, [{"topic": "home", "content": f"Note {n}: the garden needs water."}
                                for n in range(1_200)])
    monkeypatch.setattr(sqlite_store, "RANKED", 1_000_000)  # in this process: rank every match
    expected = {question: [hit.memory.id for hit in shelf.search(kaleb, question, mode="keyword", limit=limit)]
                for question, limit in (("printer", 3), ("printer toner", 3), ("garden", 5), ("jams", 600))}
    shelf.close()
    for (question, limit), ids in zip((("printer", 3), ("printer toner", 3), ("garden", 5), ("jams", 600)),
                                      expected.values()):
        found = json.loads(ok(tmp_path, "--json", "search", question, "--limit", str(limit)).stdout)["hits"]
        assert [hit["memory"]["id"] for hit in found] == ids, question
    assert expected["printer toner"][0] != expected["printer"][0]  # the toner line, found by its rare word
    assert len(expected["jams"]) == 600  # a limit above the bound gets as many hits


@pytest.mark.parametrize("unset, named", [(("MEMSHELF_TENANT",), "no --tenant given"),
                                          (("MEMSHELF_USER",), "no --user given"),
                                          (("MEMSHELF_TENANT", "MEMSHELF_USER"), "no --tenant and no --user given")])
def test_a_missing_half_of_the_owner_is_named(tmp_path, unset, named):
    """A command for one owner without its tenant or its user says which is missing, and writes nothing."""
    environment = {name: "" for name in unset}
    proc = run(tmp_path, "remember", "network", "The office printer is on 192.168.1.40.", env=environment)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: {named}: ") and "--tenant and --user" in proc.stderr
    assert ok(tmp_path, "list").stdout.strip() == ""
