"""What a worker controls reaches the Prefect ``-outputs`` artifact as text, never as
Markdown (issue 33, item 5): output names and values and the root cause cannot make a
link, an image, HTML or an extra table cell, a backtick in a name cannot break out of its
code span, and control characters are shown escaped. Rendered with markdown-it-py's
GFM-like preset (tables, autolinks), as a Markdown UI would."""

from __future__ import annotations

import pytest
from torchstep.result import RankResult, ReplicaResult, StepResult
from torchstep_prefect.artifacts import outputs_markdown

markdown_it = pytest.importorskip("markdown_it")
pytest.importorskip("linkify_it")  # gfm-like autolinks bare URLs: what the tests check

LINK = "[click me](https://evil.example/phish)"
IMAGE = "![pixel](https://evil.example/track.png)"
HTML = "<img src=x onerror=alert(1)>"
AUTOLINK = "see https://evil.example and www.evil.example and a@evil.example and evil.com"


def render(text: str) -> str:
    return markdown_it.MarkdownIt("gfm-like").render(text)


def hostile_result() -> StepResult:
    rc = RankResult(
        "w",
        1,
        1,
        "FAILED",
        1,
        replica_id=0,
        message="exited with code 1",
        tail=[f"ValueError: {LINK} {IMAGE} {HTML} {AUTOLINK} **bold** | cell \x1b]0;owned\x07"],
    )
    outputs = {
        "k`ey` [x](https://evil.example) | more": f"{LINK} {IMAGE}",
        "html": HTML,
        "auto": AUTOLINK,
        "acc": float("nan"),
    }
    return StepResult(
        "app-1", "FAILED", 1, root_cause=rc, outputs=outputs, replicas=[ReplicaResult("w", 0, "FAILED", 1, ranks=[rc])]
    )


def test_nothing_a_worker_wrote_becomes_a_link_an_image_or_html() -> None:
    html = render(outputs_markdown(hostile_result()))
    assert "<a " not in html and "<img" not in html and "&lt;img src=x" in html
    assert "<strong>bold" not in html
    assert "\x1b" not in html and "\x07" not in html and "\\x1b]0;owned\\x07" in html


def test_every_output_stays_one_row_of_two_cells_and_a_backtick_stays_in_its_code_span() -> None:
    html = render(outputs_markdown(hostile_result()))
    rows = html.split("<tbody>")[1].split("</tbody>")[0].split("<tr>")[1:]
    assert len(rows) == 4
    assert all(row.count("<td>") == 2 for row in rows), rows
    key_cells = [row.split("<td>")[1] for row in rows]
    assert any("<code>k`ey` [x](https://evil.example) | more</code>" in cell for cell in key_cells), key_cells


def test_a_nan_output_reads_nan_in_the_artifact() -> None:
    assert '"NaN"' in render(outputs_markdown(hostile_result())).replace("&quot;", '"')


def test_a_stopped_step_says_what_stopped_it_and_where_the_ranks_were_as_text() -> None:
    where = "rank 3 at ranks.py:36 in load_batch; ranks 0-2 waiting in all_reduce"
    stopped = StepResult("app-1", "CANCELLED", 143, message=f"timed out after 90 s; where the ranks were: {where}")
    html = render(outputs_markdown(stopped))
    assert "timed out after 90 s; where the ranks were: rank 3 at ranks.py:36 in load_batch" in html
    assert "ranks 0-2 waiting in all_reduce" in html and "<em>" not in html  # load_batch's _ is not emphasis
    hostile = render(outputs_markdown(StepResult("app-1", "CANCELLED", 143, message=f"stopped {LINK} {HTML}")))
    assert "<a " not in hostile and "<img" not in hostile
