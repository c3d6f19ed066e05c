"""The public surface is explicit: __all__ is what the README lists, and everything in it imports."""

from __future__ import annotations

import re
from pathlib import Path

import memshelf

README = Path(__file__).resolve().parent.parent / "README.md"


def test_all_matches_the_readme():
    text = README.read_text(encoding="utf-8")
    section = text.split("The public API is exactly what", 1)[1].split("\nEvery error", 1)[0]
    documented = set(re.findall(r"`([A-Za-z_]+)`", section)) - {"memshelf", "__all__"}
    assert documented == set(memshelf.__all__)


def test_every_public_name_exists():
    for name in memshelf.__all__:
        assert getattr(memshelf, name) is not None, name


def test_import_has_no_side_effects(tmp_path, monkeypatch):
    """No files, no network, no heavy imports when memshelf is imported."""
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    code = "import sys, memshelf; print(sorted(m for m in ('torch', 'sentence_transformers') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert list(tmp_path.iterdir()) == []


def test_the_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    """The README's Python block, run as written (keyword search only, so no model is needed here)."""
    text = README.read_text(encoding="utf-8")
    code = text.split("## Python\n\n```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSHELF_EMBEDDER", "none")
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "1.0  [network] The office printer is on 192.168.1.40." in printed
    assert "Memory context:\nKnown facts about the user:\n  - user_name: Kaleb" in printed
