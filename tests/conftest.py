"""Shared pytest setup: fixture plugins that start real servers on free ports."""

pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.elasticsearch",
    "tests.fixtures.http_receiver",
    "tests.fixtures.chromium",
]

# A developer's running `rootrank up` (its context file) must not leak into the tests' commands.
import os as _os
import tempfile as _tempfile

_os.environ.setdefault("ROOTRANK_CONTEXT", _os.path.join(_tempfile.gettempdir(), "rootrank-tests-no-context.json"))
