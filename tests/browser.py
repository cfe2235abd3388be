"""Headless Chromium for the page's tests: the DOM after load, a screenshot; every run bounded.

Each run gets its own profile folder and process group; one that outlives its bound is killed
by its process group id (the PID of the browser we started), with every child it forked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

#: Seconds a single run of the browser may take.
RUN_TIMEOUT = 60
FLAGS = [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--disable-extensions',
    '--disable-dev-shm-usage',
]
#: Elements without an end tag.
VOID = {'area', 'base', 'br', 'col', 'embed', 'hr', 'img', 'input', 'link', 'meta', 'source', 'track', 'wbr'}


class Chromium:
    """One headless Chromium binary, run once per page."""

    def __init__(self, binary: str, scratch: Path) -> None:
        self.binary = binary
        self.scratch = scratch

    def _run(self, *args: str) -> str:
        profile = tempfile.mkdtemp(prefix='profile-', dir=self.scratch)
        argv = [self.binary, *FLAGS, f'--user-data-dir={profile}', *args]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own group: the browser and its children
            proc.communicate(timeout=10)
            raise AssertionError(f'chromium did not finish within {RUN_TIMEOUT}s: {" ".join(argv)}') from None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # helpers left behind by a finished browser
            except ProcessLookupError:
                pass
        assert proc.returncode == 0, err.decode(errors='replace')[-2000:]
        return out.decode('utf-8', errors='replace')

    def dump_dom(self, url: str) -> Dom:
        """Load ``url``, let its scripts (if any) run, and parse the DOM the browser serialises."""
        return Dom.parse(self._run('--virtual-time-budget=2000', '--dump-dom', url))

    def screenshot(self, url: str, path: Path, width: int = 1280, height: int = 900) -> Path:
        self._run(f'--screenshot={path}', f'--window-size={width},{height}', '--hide-scrollbars', url)
        assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n', f'no PNG at {path}'
        return path


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ''
    children: list[Element] = field(default_factory=list)

    def descendants(self, tag: str) -> list[Element]:
        """Elements with this tag inside this one, in document order."""
        found = []
        for child in self.children:
            if child.tag == tag:
                found.append(child)
            found += child.descendants(tag)
        return found

    def cells(self) -> list[str]:
        """The text of each cell of a table row, whitespace collapsed."""
        return [' '.join(cell.text.split()) for cell in self.children if cell.tag in ('td', 'th')]


@dataclass
class Dom:
    """A serialised DOM, read into elements (tag, attributes, text content)."""

    source: str
    elements: list[Element] = field(default_factory=list)

    @classmethod
    def parse(cls, source: str) -> Dom:
        dom = cls(source)
        parser = _Builder(dom)
        parser.feed(source)
        parser.close()
        return dom

    def by_id(self, element_id: str) -> Element | None:
        return next((el for el in self.elements if el.attrs.get('id') == element_id), None)

    def text_of(self, element_id: str) -> str:
        element = self.by_id(element_id)
        assert element is not None, f'no element #{element_id}'
        return ' '.join(element.text.split())

    def find(self, tag: str, **attrs: str) -> list[Element]:
        """Elements with this tag whose attributes contain these values (``class_`` for class)."""
        wanted = {k.rstrip('_'): v for k, v in attrs.items()}
        found = []
        for el in self.elements:
            if el.tag != tag:
                continue
            if all(
                v in el.attrs.get(k, '').split() if k == 'class' else el.attrs.get(k) == v for k, v in wanted.items()
            ):
                found.append(el)
        return found

    @property
    def title(self) -> str:
        titles = self.find('title')
        return titles[0].text if titles else ''


class _Builder(HTMLParser):
    def __init__(self, dom: Dom) -> None:
        super().__init__(convert_charrefs=True)
        self.dom = dom
        self.open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or '' for k, v in attrs})
        if self.open:
            self.open[-1].children.append(element)
        self.dom.elements.append(element)
        if tag not in VOID:
            self.open.append(element)

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self.open) - 1, -1, -1):
            if self.open[index].tag == tag:
                del self.open[index:]
                return

    def handle_data(self, data: str) -> None:
        for element in self.open:
            element.text += data
