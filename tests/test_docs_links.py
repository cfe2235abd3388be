"""Every relative link in the README and in docs/ leads somewhere: the file exists, and so
does the heading a ``#anchor`` names (anchors as the repository host renders them)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]

_FENCE = re.compile(r'^\s*(```|~~~)')
_HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')
_CODE_SPAN = re.compile(r'(`+)(.+?)\1')
_LINK = re.compile(r'!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """The anchor of a heading: its text without markup, lower case, punctuation dropped,
    spaces made hyphens."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', text)
    text = re.sub(r'[*_]{1,3}(\S(?:.*?\S)?)[*_]{1,3}', r'\1', text)
    text = text.strip().lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(page: Path) -> set[str]:
    """Every anchor a page offers, with the numbered suffixes of repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text(encoding='utf-8')):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f'{base}-{count}')
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link on a page, code left out."""
    found = []
    fenced = False
    for number, line in enumerate(page.read_text(encoding='utf-8').splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in _LINK.finditer(_CODE_SPAN.sub('', line)):
            found.append((number, match.group(2)))
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """The relative links of ``page`` whose file or anchor does not exist (``root``: where
    the reported paths start)."""
    broken = []
    for number, target in links(page):
        if re.match(r'^[a-z][a-z0-9+.-]*:', target, re.IGNORECASE):  # https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition('#')
        destination = (page.parent / unquote(path_part)).resolve() if path_part else page
        where = f'{page.relative_to(root)}:{number}: {target}'
        if not destination.exists():
            broken.append(f'{where} (no such file)')
        elif anchor and (destination.suffix != '.md' or unquote(anchor) not in anchors(destination)):
            broken.append(f'{where} (no such heading)')
    return broken


def test_the_pages_are_found() -> None:
    assert (ROOT / 'README.md').exists()
    assert len(PAGES) > 1, 'docs/*.md holds the reference pages'


@pytest.mark.parametrize('page', PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_check_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / 'other.md').write_text('# Other page\n\n## A `code` heading: here\n')
    page = tmp_path / 'page.md'
    page.write_text(
        '# Page\n\n'
        '[fine](other.md#a-code-heading-here) [fine](#page) [fine](https://example.org/x)\n'
        '[missing file](nowhere.md) [missing anchor](other.md#nope) [missing here](#nope)\n'
        '```\n[in code](nowhere.md)\n```\n'
        '`[in a span](nowhere.md)`\n'
    )
    assert [entry.split(': ', 1)[1] for entry in broken_links(page, tmp_path)] == [
        'nowhere.md (no such file)',
        'other.md#nope (no such heading)',
        '#nope (no such heading)',
    ]


def test_repeated_headings_get_numbered_anchors(tmp_path: Path) -> None:
    page = tmp_path / 'page.md'
    page.write_text("# Results\n\n## Results\n\n### RQ's own test suite\n")
    assert anchors(page) == {'results', 'results-1', 'rqs-own-test-suite'}
