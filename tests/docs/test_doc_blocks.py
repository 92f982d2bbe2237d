"""The runner of the docs' code blocks (tools/doc_blocks.py; `make docs-examples` in `make
test` runs every block): every block of README.md and docs/*.md is either run or marked
with a known reason, and the runner reads blocks as a reader would."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("doc_blocks", ROOT / "tools" / "doc_blocks.py")
assert _spec is not None and _spec.loader is not None
doc_blocks = importlib.util.module_from_spec(_spec)
sys.modules["doc_blocks"] = doc_blocks
_spec.loader.exec_module(doc_blocks)


@pytest.mark.parametrize("page", doc_blocks.PAGES, ids=lambda p: p.name)
def test_every_block_runs_or_says_why_not(page: Path) -> None:
    for b in doc_blocks.blocks(page):  # raises on a marker without a known reason
        if b.skip is not None:
            reason, why = b.skip
            assert reason in doc_blocks.REASONS and len(why) > 5, b.where
            assert b.lang in doc_blocks.RUN, f"{b.where}: a {b.lang or 'plain'} block is not run anyway"


def test_most_blocks_that_a_reader_could_run_here_are_run() -> None:
    """Skips are for what cannot run here (a cluster, a server, an upload) or is run by its
    own test; excerpts are the exception."""
    found = [b for page in doc_blocks.PAGES for b in doc_blocks.blocks(page) if b.lang in doc_blocks.RUN]
    ran = [b for b in found if b.runs]
    fragments = [b for b in found if b.skip and b.skip[0] == "fragment"]
    assert len(ran) >= 30 and len(fragments) < len(ran) / 2, (len(ran), len(fragments), len(found))


def test_a_marker_with_an_unknown_reason_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("<!-- docs-test: skip because: it is hard -->\n```bash\nmake\n```\n")
    with pytest.raises(ValueError, match="unknown docs-test marker"):
        doc_blocks.blocks(page)


def test_blocks_markers_and_files_to_save(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "Save this as `pkg/hello.py`:\n\n```python\nprint('hi')\n```\n\n"
        "<!-- docs-test: skip cluster: kubectl apply -->\n```console\n$ kubectl apply -f x.yaml\n```\n\n"
        "```text\noutput\n```\n"
    )
    saved, skipped, shown = doc_blocks.blocks(page)
    assert (saved.save_as, saved.runs) == ("pkg/hello.py", True)
    assert (skipped.skip, skipped.runs) == (("cluster", "kubectl apply"), False)
    assert (shown.lang, shown.runs) == ("text", False)


def test_console_blocks_run_their_commands_not_their_output() -> None:
    body = "$ torchstep run x.py:f -- \\\n    --lr 0.1\ntorchstep: x SUCCEEDED\n$ echo done\ndone\n"
    assert doc_blocks.console_script(body) == "torchstep run x.py:f -- \\\n    --lr 0.1\necho done"
    assert doc_blocks.console_script("pip install torchstep\n") == "pip install torchstep\n"


def test_a_page_runs_in_order_in_one_session_and_a_failure_is_reported(tmp_path: Path) -> None:
    """Blocks share one Python namespace and one directory; a doctest compares its output;
    a failing block is reported with its output; nothing a block started outlives it."""
    page = tmp_path / "p.md"
    page.write_text(
        "```python\nx = 41\n```\n\n```python\n>>> y = x + 1\n>>> y\n42\n```\n\n"
        "```bash\necho hello > note.txt\n```\n\n```python\nprint(open('note.txt').read())\n```\n\n"
        "```python\n>>> x, y\n(41, 40)\n```\n\n```console\n$ false\n```\n"
    )
    original = doc_blocks.ROOT
    found, failures, _ = doc_blocks.run_page(page)
    assert doc_blocks.ROOT == original
    assert len(found) == 6
    assert [(b.line, b.lang) for b, _ in failures] == [(19, "python"), (24, "console")]
    assert "Expected:\n    (41, 40)\nGot:\n    (41, 42)" in failures[0][1]  # y from an earlier doctest
    assert "exit 1" in failures[1][1]


def test_a_console_block_shows_output_that_the_commands_print() -> None:
    shown = doc_blocks.shown_output("$ torchx run x\n# kfp run: echo-pedkrf\n...\n- '{\"a\":1,...}'\n")
    assert shown == ["# kfp run: echo-pedkrf", "- '{\"a\":1,...}'"]
    printed = 'noise\n# kfp run: echo-x1y2z3\nmore\n- \'{"a":1,"b":2}\'\n'
    assert doc_blocks.unmatched(shown, printed) is None
    assert doc_blocks.unmatched(shown, "- '{\"a\":1}'\n# kfp run: echo-x1y2z3\n") == shown[1]  # out of order
    assert doc_blocks.unmatched(["# kfp run: echo-pedkrf"], "# kfp run: train-x1y2z3\n") is not None
    assert doc_blocks.shown_output("export A=1\nairflow db migrate\n") == []  # no prompts: all commands
