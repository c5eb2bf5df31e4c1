"""A griffe extension for the API reference: the docstrings' reStructuredText habits, rendered as Markdown.

The docstrings are Google-style, with two Sphinx habits that Markdown does not know:

- roles: ``:func:`icml25.kernels.lazy.lazy_namespace``` becomes a mkdocs-autorefs cross-reference when it
  names an ``icml25`` object (so a reference to an object the site does not have fails the strict build), and
  inline code otherwise (``:class:`torch.nn.Module```; a leading ``~`` is dropped). A name that a subpackage
  exports through a lazy ``__getattr__`` (the ``aliases`` option, from ``docs/build_site.py``) points at the
  object where it is defined;
- doctest lines (``>>> x``) outside an ``Examples:`` section become a fenced ``pycon`` block (Markdown would
  read their output, e.g. ``[4, 16, None]``, as a link).

Loaded by ``docs/build_site.py``'s generated config; it changes only what the site shows, never a source file.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(mod|func|class|data|attr|meth|obj|exc|const):`~?([^`<>]+?)`")


def _role(match: re.Match[str], aliases: dict[str, str]) -> str:
    target = match.group(2).strip()
    if target.startswith("icml25."):
        return f"[`{target}`][{aliases.get(target, target)}]"
    return f"`{target}`"


def _fence_doctests(text: str) -> str:
    out: list[str] = []
    lines = text.splitlines()
    i, fence = 0, False
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and line.lstrip().startswith(">>> "):
            indent = line[: len(line) - len(line.lstrip())]
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
                i += 1
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def markdown(text: str, aliases: dict[str, str] | None = None) -> str:
    """A docstring's text with its roles and doctest lines in Markdown; ``aliases`` maps a name a package
    exports lazily (``pkg.name``) to the path of the object (``pkg.hf.name``)."""
    return ROLE.sub(lambda match: _role(match, aliases or {}), _fence_doctests(text))


class RstToMarkdown(griffe.Extension):
    """Rewrite every loaded object's docstring with :func:`markdown`."""

    def __init__(self, aliases: dict[str, str] | None = None) -> None:
        super().__init__()
        self.aliases = dict(aliases or {})

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value, self.aliases)
