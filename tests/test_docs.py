"""The documentation stands alone and tells the truth the code holds.

- Every generated table in docs/ is what `tests/doc_tables.py` renders from the code today.
- Nothing in the repository points outside it: no path out of the checkout, no numbered section
  of a document, and every `*.md` file it names (with its `#anchor`) exists here.
- Every relative link and image of the README, CONTRIBUTING.md, CHANGELOG.md and docs/ resolves,
  anchors included.
- A reader finds every setting, config key, route and command in docs/.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.doc_tables import DOCS, blocks, render

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *DOCS.glob("*.md")])

SKIPPED_DIRS = {"__pycache__", "build", "dist", "node_modules"}
"""Besides hidden directories (`.git`, `.venv`, caches) other than `.ci`, and `*.egg-info`."""

OUTSIDE = "." + "./shared"  # spelled in two parts so that this file does not name it
SECTION_SIGN = re.compile("\u00a7" + r"\s*\d")
URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
MD_NAME = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]*\w\.md)(#[\w-]+)?(?![\w/])")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")


# ---------------------------------------------------------------------------------------------
# Generated tables.


def _generated() -> list[tuple[str, str, str]]:
    return [
        (path.name, name, body)
        for path in sorted(DOCS.glob("*.md"))
        for name, body in blocks(path.read_text())
    ]


def test_docs_have_generated_tables() -> None:
    names = {name for _, name, _ in _generated()}
    assert {"settings providerBreaker", "settings modelLockout", "settings-env", "limits resilience"} <= names


@pytest.mark.parametrize(("doc", "name", "body"), _generated(), ids=lambda v: str(v)[:40])
def test_generated_table_matches_the_code(doc: str, name: str, body: str) -> None:
    assert body == render(name), f"docs/{doc}: table '{name}' is stale: run `python -m tests.doc_tables`"


def test_every_setting_is_in_a_generated_table() -> None:
    from proxy.settings import SCHEMA

    prefixes = [name.split(" ", 1)[1] for _, name, _ in _generated() if name.startswith("settings ")]
    missing = [s.path for s in SCHEMA if not any(s.path.startswith(p + ".") for p in prefixes)]
    assert missing == []


# ---------------------------------------------------------------------------------------------
# Markdown: headings, anchors, links.


def _without_code_blocks(text: str) -> str:
    """The text with fenced code blocks blanked out (line count kept)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def anchors(path: Path) -> set[str]:
    """The `#anchors` a code host makes of a Markdown file's headings (GitHub's rule)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _without_code_blocks(path.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match[1].strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def _links(path: Path) -> Iterator[str]:
    text = re.sub(r"`[^`\n]*`", "", _without_code_blocks(path.read_text()))
    for match in LINK.finditer(text):
        yield match[1]


def _broken(target: str, page: Path) -> str | None:
    """Why a relative link from `page` leads nowhere, or None when it resolves."""
    where, _, anchor = target.partition("#")
    dest = (page.parent / where).resolve() if where else page
    if not dest.exists():
        return f"{target}: no such file"
    if not dest.is_relative_to(ROOT):
        return f"{target}: outside the repository"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: no heading makes #{anchor} in {dest.relative_to(ROOT)}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    problems = [
        reason
        for target in _links(page)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
        for reason in [_broken(target, page)]
        if reason is not None
    ]
    assert problems == []


def test_the_anchor_rule_reads_like_a_code_host() -> None:
    assert {"a-requests-path-through-the-layers", "a-429-with-retry-after-30-on-key-a"} <= anchors(
        DOCS / "resilience.md"
    )
    assert "running-headless-omniroute-serve" in anchors(DOCS / "operations.md")


# ---------------------------------------------------------------------------------------------
# Nothing points outside the repository.


def repository_files() -> Iterator[Path]:
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if any(
            (p.startswith(".") and p != ".ci") or p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts
        ):
            continue
        if path.is_file():
            yield path


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # not text


def _named_documents(path: Path, text: str) -> Iterator[tuple[int, str, str | None]]:
    """(line, file, anchor) of every `*.md` file a text names, URLs left out."""
    for number, line in enumerate(text.splitlines(), start=1):
        for match in MD_NAME.finditer(URL.sub("", line)):
            yield number, match[1], match[2][1:] if match[2] else None


def test_nothing_points_outside_the_repository() -> None:
    problems = []
    files = list(repository_files())
    assert len(files) > 100, "the walk found too few files to mean anything"
    for path in files:
        text = _text(path)
        if text is None or path == Path(__file__).resolve():  # this file names pages in order to check them
            continue
        name = path.relative_to(ROOT)
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE in line:
                problems.append(f"{name}:{number}: points outside the repository")
            if SECTION_SIGN.search(line):
                problems.append(f"{name}:{number}: cites a numbered section; cite docs/<page>.md#<anchor>")
        for number, doc, anchor in _named_documents(path, text):
            candidates = [ROOT / doc, path.parent / doc]
            found = next((c for c in candidates if c.is_file()), None)
            if found is None:
                problems.append(f"{name}:{number}: names {doc}, which is not in the repository")
            elif anchor is not None and anchor not in anchors(found):
                problems.append(f"{name}:{number}: {doc}#{anchor}: no such heading")
    assert problems == []


def test_the_reference_check_catches_what_it_should(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        f'"""see {OUTSIDE}/spec/a.md and resilience.md \u00a73"""\n# docs/resilience.md#no-such-part\n'
    )
    text = bad.read_text()
    assert OUTSIDE in text and SECTION_SIGN.search(text)
    named = [(doc, anchor) for _, doc, anchor in _named_documents(bad, text)]
    assert ("resilience.md", None) in named and ("docs/resilience.md", "no-such-part") in named
    assert not (ROOT / "resilience.md").exists()
    assert "no-such-part" not in anchors(ROOT / "docs" / "resilience.md")


# ---------------------------------------------------------------------------------------------
# A reader finds every key, default, route and command.


def _config_keys(folder: Path) -> dict[str, list[str]]:
    """The keys the config reader accepts in each table, as its own "known keys" message lists them."""
    from proxy.config import ConfigError, load_config

    toml = """
[server]
zzzzzzzz = 1
[providers.p]
class = "local"
base_url = "http://localhost:1/v1"
zzzzzzzz = 1
[[providers.p.connections]]
id = "c"
zzzzzzzz = 1
[[providers.p.restate]]
id = "r"
zzzzzzzz = 1
[combos.k]
targets = ["p/m"]
zzzzzzzz = 1
"""
    path = folder / "config.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_config(path, {}, explicit=True)
    keys: dict[str, list[str]] = {}
    for problem in caught.value.problems:
        match = re.match(r"(.*)\.zzzzzzzz: unknown key \(known keys: (.*)\)$", str(problem))
        assert match, problem
        keys[match[1]] = match[2].split(", ")
    assert len(keys) == 5, keys
    return keys


def test_every_config_key_is_documented(tmp_path: Path) -> None:
    page = (DOCS / "configuration.md").read_text()
    missing = [
        f"{table}.{key}"
        for table, names in _config_keys(tmp_path).items()
        for key in names
        if f"`{key}`" not in page
    ]
    assert missing == []


def _row(page: str, key: str) -> str:
    rows = [line for line in page.splitlines() if line.startswith(f"| `{key}` |")]
    assert len(rows) == 1, key
    return rows[0]


def test_config_defaults_are_the_documented_ones() -> None:
    from proxy.config import ConnectionConfig, ServerConfig

    page = (DOCS / "configuration.md").read_text()
    server = ServerConfig()
    for f in dataclasses.fields(ServerConfig):
        value = getattr(server, f.name)
        if value is None:
            continue
        shown = {str: f'`"{value}"`', int: f"`{value}`", tuple: "`[]`"}[type(value)]
        assert shown in _row(page, f.name), f.name
    for f in dataclasses.fields(ConnectionConfig):
        if f.default is dataclasses.MISSING or f.default is None:
            continue
        shown = f"`{str(f.default).lower()}`" if isinstance(f.default, bool) else f"`{f.default}`"
        assert shown in _row(page, f.name), f.name


def test_every_route_is_in_api_md() -> None:
    from proxy.openapi import document

    page = (DOCS / "api.md").read_text()
    routes = [(method.upper(), path) for path, item in document()["paths"].items() for method in item]
    missing = [f"{m} {p}" for m, p in routes if f"`{m} {p}" not in page]
    assert missing == []


def test_every_command_is_in_cli_md() -> None:
    import typer

    from omniroute_tui.cli import app

    def names(command: Any, prefix: str) -> Iterator[str]:
        if hasattr(command, "commands"):  # a group (typer brings its own click classes)
            for name, sub in command.commands.items():
                yield from names(sub, f"{prefix} {name}")
        else:
            yield prefix

    page = (DOCS / "cli.md").read_text()
    commands = list(names(typer.main.get_command(app), "omniroute"))
    assert len(commands) > 15
    assert [c for c in commands if f"`{c}" not in page] == []
