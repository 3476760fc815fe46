"""MkDocs hook: the README's tables, once, on the site's home page.

The README is the repository's front door and the site's home page
(docs/index.md) shows the same tables; they live in the README only, between
``<!-- section: NAME -->`` and ``<!-- end: NAME -->``, and a page includes
one with a line ``<!-- readme: NAME -->``. Links are rewritten from the
README's place (``docs/guides/x.md``) to the page's (``guides/x.md``), so
the strict build still checks every one of them.
"""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
_INCLUDE = re.compile(r"^<!-- readme: ([a-z-]+) -->$", re.M)


def readme_section(name: str) -> str:
    """The README's text between its ``section`` and ``end`` markers for ``name``."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"<!-- section: {name} -->\n(.*?)<!-- end: {name} -->", text, re.S)
    if match is None:
        raise ValueError(f"README.md has no section {name!r} (<!-- section: {name} -->)")
    return match.group(1)


def _relative_to(page_path: str, section: str) -> str:
    """``section``'s ``](docs/...)`` links as seen from the page at ``page_path``."""
    prefix = "../" * page_path.count("/")  # index.md: none; guides/x.md: one level up
    return section.replace("](docs/", f"]({prefix}")


def on_page_markdown(markdown, page, **kwargs):
    """Replaces each ``<!-- readme: NAME -->`` line with that README section."""
    del kwargs
    return _INCLUDE.sub(
        lambda match: _relative_to(page.file.src_path, readme_section(match.group(1))), markdown)
