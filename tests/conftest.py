"""Shared pytest setup: fixture plugins that start real servers on free ports."""

pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.elasticsearch",
    "tests.fixtures.http_receiver",
]
