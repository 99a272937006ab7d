"""The tree keeps its shape (issue "The house shows its architecture"): the layer contracts are
import-linter's (`lint-imports` in `make test`); these are the two rules it has no contract for."""

from __future__ import annotations

from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 700


def test_no_import_cycle() -> None:
    """Every import between modules of `correlator`, `ingest` and `lab` runs one way: no two modules import
    each other, directly or through others. Imports only for type checkers count too: they do not run, but
    they say the module depends on the other (the matcher and the prefilter once imported each other that
    way, one of them inside a function), and a cycle there is a knot a maintainer trips over all the same."""
    ours = ("correlator", "ingest", "lab")
    graph = grimp.build_graph(*ours, exclude_type_checking_imports=False)
    cycles = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if imported.split(".")[0] in ours and graph.chain_exists(importer=imported, imported=module)
    )
    chains = [graph.find_shortest_chain(importer=imported, imported=module) for module, imported in cycles]
    assert not cycles, f"modules that import each other, directly or through others: {cycles}; back: {chains}"


def test_no_source_module_over_700_lines() -> None:
    long = {str(p.relative_to(REPO)): n for top in ("correlator", "ingest", "lab") for p in (REPO / top).rglob("*.py")
            if (n := p.read_text().count("\n")) > MAX_MODULE_LINES}
    assert not long, f"split these modules by what they do: {long}"
