"""Every ``>>>`` example in tfdist's docstrings runs and prints what it says
(doctest, in its module's namespace, as ``python -m doctest`` runs it).

Examples that need a cluster or a TPU mark their lines ``# doctest: +SKIP``.
Multi-replica examples run on the 4 logical CPUs tests/conftest.py makes.
"""

import doctest
import importlib
import pkgutil

import pytest

import tfdist


def _modules():
    names = ["tfdist"]
    for info in pkgutil.walk_packages(tfdist.__path__, prefix="tfdist."):
        names.append(info.name)
    return sorted(names)


def _with_examples():
    found = []
    finder = doctest.DocTestFinder(exclude_empty=True)
    for name in _modules():
        if name.endswith(".__main__") or name == "tfdist.server":  # programs: run on import
            continue
        module = importlib.import_module(name)
        if any(test.examples for test in finder.find(module)):
            found.append(name)
    return found


# The test suite's own helpers with examples: how CI picks its rows.
TEST_HELPERS = ["tests.support.covering", "tests.support.short_form"]
MODULES = _with_examples() + TEST_HELPERS


def test_the_public_api_has_examples():
    """Not vacuous: the user-facing modules carry examples."""
    for name in ("tfdist", "tfdist.training.keras_fit", "tfdist.data.distributed",
                 "tfdist.strategies.registry", "tfdist.replica.losses"):
        assert name in MODULES, name


@pytest.fixture
def _strategy_registry_restored(monkeypatch):
    """An example's `register_strategy` ("first_cpu") stays in its test: a
    later test in the same process lists the known strategies."""
    from tfdist.strategies import registry  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, _strategy_registry_restored):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder(exclude_empty=True).find(module):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
