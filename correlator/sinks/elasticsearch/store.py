"""Transitional: the three names `correlator.cli` and `correlator.tooling.demo` still import from here.

The sink lives in `client.py`, `indices.py`, `documents.py` and `writer.py`; delete this module once
those two import from there.
"""

from correlator.sinks.elasticsearch.client import make_client
from correlator.sinks.elasticsearch.indices import incidents_names, install_templates

__all__ = ["incidents_names", "install_templates", "make_client"]
