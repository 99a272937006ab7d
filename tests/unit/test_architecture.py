"""The tree keeps its shape (issue "The house shows its architecture"): the layer contracts are
import-linter's (`lint-imports` in `make test`); these are the two rules it has no contract for."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 700


@pytest.mark.parametrize("package", ["correlator", "ingest", "lab"])
def test_no_import_cycle(package: str) -> None:
    """Imports a module makes when it runs (those only for type checkers are left out: they never execute)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    cycles = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if imported.startswith(package) and graph.chain_exists(importer=imported, imported=module)
    )
    assert not cycles, f"modules that import each other, directly or through others: {cycles}"


def test_no_source_module_over_700_lines() -> None:
    long = {str(p.relative_to(REPO)): n for top in ("correlator", "ingest", "lab") for p in (REPO / top).rglob("*.py")
            if (n := p.read_text().count("\n")) > MAX_MODULE_LINES}
    assert not long, f"split these modules by what they do: {long}"
