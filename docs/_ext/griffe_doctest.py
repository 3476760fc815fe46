"""A griffe extension for the API reference (mkdocs.yml): tfdist's docstrings
carry ``>>>`` examples in their text, not only under "Examples:", and
Markdown would render them as nested block quotes. This wraps each run of
doctest lines (a ``>>>`` line up to the next blank line or fence) in a fenced
``pycon`` code block, so the reference shows them as code."""

import griffe


def fence_doctests(text: str) -> str:
    """``text`` with every doctest run outside a fenced block fenced."""
    out, in_fence, in_doctest, indent = [], False, False, ""
    for line in text.split("\n"):
        stripped = line.lstrip()
        if in_doctest and (not stripped or stripped.startswith("```")):
            out.append(indent + "```")
            in_doctest = False
        if not in_doctest and stripped.startswith("```"):
            in_fence = not in_fence
        elif not in_doctest and not in_fence and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(indent + "```pycon")
            in_doctest = True
        out.append(line)
    if in_doctest:
        out.append(indent + "```")
    return "\n".join(out)


class FenceDoctests(griffe.Extension):
    """Fences ``>>>`` examples in every docstring."""

    def on_instance(self, *, obj, **kwargs):  # noqa: D102
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)
