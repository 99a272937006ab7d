"""The fault lab (issue #26): real training jobs with one injected fault each, and their known culprits;
`lab.synth`: an independent generator of large synthetic jobs with known culprits.

`python -m lab run|score|list`, `python -m lab.synth`; see docs/lab.md. `lab` may import `correlator`
(to score); `correlator` and `ingest` never import `lab` (an import-linter contract in pyproject.toml).
"""
