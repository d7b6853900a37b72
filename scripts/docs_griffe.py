"""A griffe extension for the docs site's API reference (mkdocs.yml, mkdocstrings): the core's
docstrings are written with Sphinx roles (``:class:`~rlweave.plugins.types.BackendRecord```) and
``Example::`` before a code block; this turns them into Markdown for mkdocstrings.

* A role whose target is an object the API pages render becomes a cross-reference
  (``[`BackendRecord`][rlweave.plugins.types.BackendRecord]``), which strict mode checks like any
  link; any other role becomes inline code (``BackendRecord``).
* ``text::`` at the end of a line becomes ``text:`` (the indented block after it is already code).
* A ``:return: text`` field becomes a line ``**Returns:** text``.
* A simple table (columns under runs of ``=``) becomes a Markdown table.

Options (``mkdocs.yml``): ``modules``, the modules the API pages render with ``:::``; a target is
linked only when it lies in one of them (not in a submodule of one), its path has no private part
and every object from the module down to it has a docstring (mkdocstrings shows no object without
one).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):`(?P<body>[^`]+)`")
DOUBLE_COLON = re.compile(r"(?<=\S)::[ \t]*$", re.MULTILINE)
EXPLICIT = re.compile(r"^(?P<text>.+?)\s*<(?P<target>[^>]+)>$")
RETURN = re.compile(r"^(?P<indent> *):returns?:[ \t]*(?P<text>.+)$", re.MULTILINE)
RULE = re.compile(r"^ *=+(?: +=+)+ *$")


class SphinxRoles(griffe.Extension):
    def __init__(self, modules: list[str] | None = None) -> None:
        super().__init__()
        self.modules = tuple(modules or ())

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        collection = loader.modules_collection
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = self.rewrite(obj.docstring.value, obj, collection)

    def rewrite(self, text: str, obj: griffe.Object, collection: Any) -> str:
        def role(match: re.Match) -> str:
            body = match.group("body").strip()
            explicit = EXPLICIT.match(body)
            if explicit:
                shown, path = explicit.group("text"), explicit.group("target")
            else:
                path = body.lstrip("~")
                shown = path.rsplit(".", 1)[-1] if body.startswith("~") else path.lstrip(".")
            target = self._find(path, obj, collection)
            return f"[`{shown}`][{target}]" if target else f"`{shown}`"

        text = RETURN.sub(r"\g<indent>**Returns:** \g<text>", ROLE.sub(role, text))
        return _tables(DOUBLE_COLON.sub(":", text))

    def _find(self, path: str, obj: griffe.Object, collection: Any) -> str | None:
        module = obj if obj.is_module else obj.module
        base = module.path if module.is_init_module else (module.parent.path if module.parent else "")
        if path.startswith("."):
            candidates = [base + path]
        else:
            candidates = [path, f"{module.path}.{path}"]
        for candidate in candidates:
            try:
                found = collection.get_member(candidate)
                if found.is_alias:
                    found = found.final_target
            except Exception:  # noqa: BLE001, S112 - not loaded, not there, or an alias that does not resolve
                continue
            if self._rendered(found):
                return found.path
        return None

    def _rendered(self, obj: griffe.Object) -> bool:
        if not any(obj.path == m or obj.path.startswith(m + ".") for m in self.modules):
            return False
        node: Any = obj
        while node is not None and node.path not in self.modules:
            if node.is_module or node.name.startswith("_") or not node.docstring:
                return False
            node = node.parent
        return True


def _tables(text: str) -> str:
    """Simple tables (a rule, the header, a rule, the rows, a rule) as Markdown tables."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        rules = [j for j in range(i, len(lines)) if RULE.match(lines[j])][:3] if RULE.match(lines[i]) else []
        if len(rules) < 3 or rules[1] != i + 2:
            out.append(lines[i])
            i += 1
            continue
        starts = [m.start() for m in re.finditer(r"=+", lines[i])]
        bounds = list(zip(starts, starts[1:] + [None]))
        table = [lines[i + 1]] + lines[i + 3:rules[2]]
        rows = [[line[a:b].strip() for a, b in bounds] for line in table if line.strip()]
        out += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(starts)]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        i = rules[2] + 1
    return "\n".join(out)


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)
