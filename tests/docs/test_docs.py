"""Rules of the documentation, checked by code: every link between pages resolves, the
operator's table of error codes lists exactly the codes the node can answer, and every
``ledgermq`` option the operator's pages name exists."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

from ledgermq.cli.main import build_parser
from tests.error_codes import HTTP_LAYER_CODES, node_codes

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL, or an anchor on the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_error_code_table_lists_every_code_and_only_those() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    table = text[text.index("<!-- error-codes -->") : text.index("<!-- end error-codes -->")]
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", table, re.MULTILINE))
    app_source = (ROOT / "api" / "app.py").read_text(encoding="utf-8")
    assert all(f'"{code}"' in app_source for code in HTTP_LAYER_CODES)
    assert documented == node_codes()


# What pointed outside the repository before docs/ existed: the design documents beside
# the checkout, and the item numbers of a checklist that lives there.
OUTSIDE = re.compile(
    r"\.\./shared|\bDESIGN(?:\.md)? ?§|\bAPI(?:\.md)? ?§|\b(?:DESIGN|API|STYLE)\.md\b"
    r"|\bCHECKLIST\b|\bseeds/|\b(?:JR|RP|LE|ST|MQ|CV)-\d{2}\b"
)


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    suffixes = {".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".ini", ""}
    return [ROOT / n for n in names if Path(n).suffix in suffixes and (ROOT / n).is_file()]


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a binary file (a fuzz regression input)
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line) and path.name != "test_docs.py":
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not found, "\n".join(found)


# The pages an operator or a user configures from; options of other programs they show.
OPTION_PAGES = ["operations.md", "http.md", "concepts.md", "consuming.md", "client.md"]
OTHER_PROGRAMS = {"--now", "--data-binary", "--max-"}  # systemctl, curl, "--max-..."


def ledgermq_options() -> set[str]:
    known: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:  # argparse has no public walk over sub-parsers
            known.update(action.option_strings)
            if isinstance(action, argparse.BooleanOptionalAction):
                known.update("--no-" + o[2:] for o in action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser())
    return known


def test_every_option_the_pages_name_exists() -> None:
    known = ledgermq_options() | OTHER_PROGRAMS
    unknown = []
    for name in OPTION_PAGES:
        text = (ROOT / "docs" / name).read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line):
                if option not in known:
                    unknown.append(f"docs/{name}:{n}: {option}")
    assert not unknown, unknown
