"""The public API is pinned: ``tests/public_api.txt`` lists every public
name's signature (`tests.support.api_listing`), and a change to the code
that the listing does not show fails here with the diff. A deliberate
change rewrites the listing (``python3 -m tests.support.api_listing
--write``) and adds its CHANGELOG line."""

import difflib

from tests.support import api_listing


def test_the_public_api_is_the_checked_in_listing():
    expected = api_listing.LISTING.read_text(encoding="utf-8").splitlines()
    actual = api_listing.listing()
    diff = list(difflib.unified_diff(expected, actual, "tests/public_api.txt", "the code",
                                     lineterm="", n=1))
    assert not diff, (
        "The public API changed. If that is deliberate, run `python3 -m "
        "tests.support.api_listing --write` and add a CHANGELOG line:\n" + "\n".join(diff))


def test_the_listing_sees_a_changed_signature(monkeypatch):
    """The check itself: a keyword added to attach shows in the listing."""
    import tfdist  # pylint: disable=import-outside-toplevel

    before = [line for line in api_listing.listing() if line.startswith("tfdist.attach(")]

    def attach(model, strategy=None, *, checkpointing=None, extra=None):
        del model, strategy, checkpointing, extra

    monkeypatch.setattr(tfdist, "attach", attach)
    after = [line for line in api_listing.listing() if line.startswith("tfdist.attach(")]
    assert before != after and "extra=None" in after[0]


def test_the_listing_reaches_the_subpackages_and_the_records():
    lines = api_listing.listing()
    assert any(line.startswith("class tfdist.DataOptions(") for line in lines)
    assert "  field partial_batch: Optional[str]" in lines or any(
        line.startswith("  field partial_batch") for line in lines)
    assert any(line.startswith("tfdist.data.distribute(") for line in lines)
    assert len(lines) > 100
