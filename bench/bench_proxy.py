"""What the memory proxy adds to a chat request (issue 15): latency, and time to the first streamed byte.

A loopback upstream that speaks the chat API (answering at once, or streaming five chunks) runs in this process;
`memshelf serve --upstream` runs as a subprocess in front of it, over a fresh SQLite file whose user has --memories
memories and a few facts. Each round sends the same chat request twice, back to back and in alternating order:
once to the upstream directly, once through the proxy (which builds the memory context for the question, forwards,
then logs both turns and learns from the thread after answering). The proxy's cost is the median of the paired
differences; both p50s are printed beside it, measured in the same run. Streamed, the bench also times the relay:
from the upstream handing its first chunk to its server until the client has it (one clock: the upstream runs in
this process), which is what the proxy adds to a stream once it is flowing. Rounds are --gap seconds apart (default
0.1), as a chat's turns are: the proxy logs and learns after each answer, and back to back (--gap 0) that work of
one round overlaps the next round's request on this 2-core machine.

Two servers are measured: `--embedder none` (keyword search: the proxy's own cost, no question embedding) and
`--embedder local` (the offline MiniLM model: the question's embedding included).

--src PATH serves another source tree (e.g. a worktree of an older commit) as a second proxy, so two versions
are measured in one run: the rounds take the proxies in turn, each round pairing one proxy with a direct call.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_proxy.py                     # 300 rounds, both embedders
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_proxy.py --rounds 100 --embedders none --json out.json
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_proxy.py --embedders none --src ../before/src --src src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (ROOT, TextGenerator, fmt_ms, free_port, machine, memshelf_serve, percentile,  # noqa: E402
                     print_table, save_json)

from memshelf import Owner, Shelf  # noqa: E402

OWNER = Owner("bench", "kaleb")
QUESTION = "What did I say about the printer on the office network?"
ANSWER = {"id": "c1", "object": "chat.completion", "created": 1, "model": "tiny",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "It is on 192.168.1.40."},
                       "finish_reason": "stop"}]}


FIRST_CHUNK_SENT: list[float] = []
"""When the upstream handed its latest stream's first chunk to the server (perf_counter: the client's clock too)."""


def upstream_app() -> Starlette:
    async def completions(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):
            return JSONResponse(ANSWER)

        async def events() -> Any:
            for n, word in enumerate(["It ", "is ", "on ", "192.168.1.40", "."]):
                chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "tiny",
                         "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
                if n == 0:
                    FIRST_CHUNK_SENT.append(time.perf_counter())
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                await asyncio.sleep(0.002)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


@contextmanager
def upstream() -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(upstream_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def proxy(db: Path, embedder: str, upstream_url: str, src: Path) -> Iterator[str]:
    env = {"MEMSHELF_EMBEDDER": embedder, "PYTHONPATH": str(src)}
    with memshelf_serve(["--db", str(db)], ["--upstream", upstream_url], env) as url:
        yield url + "/v1"


def seed(db: Path, embedder: str, memories: int) -> str:
    """The user's memories (a few about the printer among generated ones) and facts; returns a tenant key."""
    generated = TextGenerator(seed=11).sentences(memories - 3)
    with Shelf.open(db, embedder=None if embedder == "none" else embedder) as shelf:
        items = [{"topic": topic, "content": content, "source": source} for topic, content, source in generated]
        items += [{"topic": "network", "content": line} for line in (
            "The office printer is on 192.168.1.40.", "The printer jams on thick paper.",
            "The guest network is called tulip.")]
        shelf.remember_many(OWNER, items)
        shelf.set_fact(OWNER, "user_name", "Kaleb")
        shelf.set_fact(OWNER, "home_city", "Porto")
        return shelf.create_key(OWNER.tenant)[1]


def timed(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, float]:
    start = time.perf_counter()
    answer = client.post(url + "/chat/completions", json=body, headers=headers)
    answer.raise_for_status()
    return {"request": time.perf_counter() - start}


def first_byte(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, float]:
    """Time to the first streamed byte, and the relay: from the upstream handing its first chunk to its server
    until this client has it (with the proxy between them, the proxy's pass-through delay)."""
    start = time.perf_counter()
    arrived = None
    with client.stream("POST", url + "/chat/completions", json=body, headers=headers) as answer:
        answer.raise_for_status()
        for _ in answer.iter_raw():  # read to the end, so the proxy finishes the exchange as a client would
            if arrived is None:
                arrived = time.perf_counter()
    assert arrived is not None, "the stream was empty"
    return {"first byte": arrived - start, "relay": arrived - FIRST_CHUNK_SENT[-1]}


def measure(embedder: str, rounds: int, memories: int, gap: float, sources: list[Path]) -> dict[str, Any]:
    """{source tree: {measure: numbers}}: every proxy against the same direct calls, round by round."""
    with tempfile.TemporaryDirectory() as folder, upstream() as direct, ExitStack() as stack:
        db = Path(folder) / "memory.db"
        secret = seed(db, embedder, memories)
        proxies = [stack.enter_context(proxy(db, embedder, direct, src)) for src in sources]
        client = stack.enter_context(httpx.Client(timeout=60))
        body = {"model": "tiny", "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                              {"role": "user", "content": QUESTION}]}
        mine = {"Authorization": f"Bearer {secret}", "X-Memshelf-User": OWNER.user, "X-Memshelf-Thread": "bench"}
        streamed = {**body, "stream": True}
        for _ in range(10):  # warm every path (and load the model, for local)
            for url, headers in ((direct, {}), *((through, mine) for through in proxies)):
                timed(client, url, body, headers)
        results: dict[str, Any] = {str(src): {} for src in sources}
        for call, payload in ((timed, body), (first_byte, streamed)):
            # One proxy per round, in turn, each paired with its own direct call: a proxy's logging and learning
            # after its answer must not overlap the next proxy's request.
            plain: list[list[dict[str, float]]] = [[] for _ in sources]
            proxied: list[list[dict[str, float]]] = [[] for _ in sources]
            for n in range(rounds * len(sources)):
                index = n % len(sources)
                order = [(plain[index], direct, {}), (proxied[index], proxies[index], mine)]
                for samples, url, headers in (order if n // len(sources) % 2 == 0 else order[::-1]):
                    samples.append(call(client, url, payload, headers))
                time.sleep(gap)
            for src, mine_plain, mine_proxied in zip(sources, plain, proxied):
                for name in mine_plain[0]:
                    direct_times = [sample[name] for sample in mine_plain]
                    proxy_times = [sample[name] for sample in mine_proxied]
                    added = sorted(p - d for p, d in zip(proxy_times, direct_times))
                    results[str(src)][name] = {"direct_p50_ms": percentile(direct_times, 50) * 1000,
                                               "proxy_p50_ms": percentile(proxy_times, 50) * 1000,
                                               "added_p50_ms": percentile(added, 50) * 1000,
                                               "added_p90_ms": percentile(added, 90) * 1000}
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300, help="paired requests per measurement")
    parser.add_argument("--memories", type=int, default=2000, help="memories of the user the proxy searches")
    parser.add_argument("--embedders", default="none,local", help="comma-separated: none, local")
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between rounds (0: back to back)")
    parser.add_argument("--src", action="append", type=Path, help="source tree to serve (repeatable; default src)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    sources = [src.resolve() for src in (args.src or [ROOT / "src"])]
    report: dict[str, Any] = {"machine": machine(), "rounds": args.rounds, "memories": args.memories,
                              "gap_s": args.gap, "runs": {}}
    rows = []
    for embedder in args.embedders.split(","):
        found = measure(embedder, args.rounds, args.memories, args.gap, sources)
        report["runs"][embedder] = found
        for src, measures in found.items():
            for name, numbers in measures.items():
                rows.append([embedder, os.path.relpath(src), name, fmt_ms(numbers["direct_p50_ms"]),
                             fmt_ms(numbers["proxy_p50_ms"]), fmt_ms(numbers["added_p50_ms"]),
                             fmt_ms(numbers["added_p90_ms"])])
    print_table(f"memory proxy vs the upstream directly ({args.rounds} paired rounds {args.gap} s apart, "
                f"{args.memories} memories)",
                ["embedder", "source", "measure", "direct p50", "proxy p50", "added p50", "added p90"], rows)
    save_json(args.json, report)


if __name__ == "__main__":
    main()
