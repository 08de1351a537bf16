"""The docs stay true to the tree: the generated config page is current, and no link is dead."""

from __future__ import annotations

import re
from pathlib import Path

from proxy.config_doc import REGENERATE, markdown

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted(REPO.glob("examples/*/README.md"))]


def relative_links(text: str) -> list[str]:
    text = CODE.sub("", FENCE.sub("", text))
    targets = (m.group(1) for m in LINK.finditer(text))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def test_configuration_page_is_generated_from_the_config_models() -> None:
    page = REPO / "docs" / "configuration.md"
    assert page.is_file(), f"docs/configuration.md is missing: run `{REGENERATE}`"
    assert page.read_text(encoding="utf-8") == markdown(), f"docs/configuration.md is out of date: run `{REGENERATE}`"


def test_every_relative_link_points_at_a_file() -> None:
    dead = []
    for doc in doc_files():
        for target in relative_links(doc.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                dead.append(f"{doc.relative_to(REPO)}: {target}")
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_the_link_finder_sees_links_and_skips_code() -> None:
    text = "[a](x.md) ![c](img/c.png#top) [b](https://e.org) [d](#here)\n`[e](no.md)`\n```\n[f](no.md)\n```\n"
    assert relative_links(text) == ["x.md", "img/c.png#top"]
