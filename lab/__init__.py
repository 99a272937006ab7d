"""The fault lab (issue #26): real training jobs with one injected fault each, and their known culprits.

`python -m lab run|score|list`; see docs/lab.md. `lab` may import `correlator` (to score);
`correlator` and `ingest` never import `lab` (an import-linter contract in pyproject.toml).
"""
