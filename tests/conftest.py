"""Shared pytest setup: fixture plugins that start real servers on free ports."""

import os as _os
import tempfile as _tempfile

pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.elasticsearch",
    "tests.fixtures.http_receiver",
    "tests.fixtures.chromium",
]

# A developer's running `rootrank up` (its context file) must not leak into the tests' commands.

_os.environ.setdefault("ROOTRANK_CONTEXT", _os.path.join(_tempfile.gettempdir(), "rootrank-tests-no-context.json"))
