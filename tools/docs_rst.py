"""A griffe extension for the API reference (mkdocs.yml): the docstrings use a few
reStructuredText forms that Markdown would show as typed — Sphinx roles
(``:func:`~torchstep.explain```) and literal blocks after ``::`` (``Example::``). This turns
them into Markdown as the docstring is loaded (code spans and fenced code), so the source
keeps the form IDEs and ``help()`` show well.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|exc|data|obj|const):`([^`]+)`")


def role_to_code(m: re.Match[str]) -> str:
    target = m.group(1)
    if "<" in target and target.endswith(">"):  # :func:`title <target>`
        return f"`{target[: target.index('<')].strip()}`"
    if target.startswith("~"):  # :class:`~a.b.C` shows C
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def language(block: list[str]) -> str:
    text = "\n".join(block)
    if text.lstrip().startswith(">>>"):
        return "pycon"
    try:
        ast.parse(text)
    except SyntaxError:
        return "text"
    return "python"


def literal_blocks(text: str) -> str:
    """``para::`` + an indented block → ``para:`` + a fenced block (``Example::`` → **Example**);
    a bare doctest block (``>>>`` lines up to a blank line) → a fenced block."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>"):  # a bare doctest block: up to the next blank line
            pad = line[: len(line) - len(line.lstrip())]
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            out += ["", f"{pad}```pycon", *lines[i:j], f"{pad}```", ""]
            i = j
            continue
        if not line.rstrip().endswith("::"):
            out.append(line)
            i += 1
            continue
        head = line.rstrip()[:-1]
        if head.strip() in ("Example:", "Examples:"):
            head = head.replace(head.strip(), f"**{head.strip()[:-1]}**")
        out.append(head)
        base = len(line) - len(line.lstrip())
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j >= len(lines) or len(lines[j]) - len(lines[j].lstrip()) <= base:
            i += 1  # no indented block follows: the "::" was prose
            continue
        indent = len(lines[j]) - len(lines[j].lstrip())
        block: list[str] = []
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) >= indent):
            block.append(lines[j][indent:])
            j += 1
        while block and not block[-1].strip():
            block.pop()
        pad = " " * base
        out += ["", f"{pad}```{language(block)}", *(pad + b if b else "" for b in block), f"{pad}```", ""]
        i = j
    return "\n".join(out)


class RstToMarkdown(griffe.Extension):
    """Rewrites each docstring once it is loaded (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = literal_blocks(ROLE.sub(role_to_code, obj.docstring.value))
