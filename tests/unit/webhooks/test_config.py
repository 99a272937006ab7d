"""Webhook settings: token from the environment, routes from the file, and the token never printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from correlator.config import load_settings
from correlator.sinks.webhooks.dispatcher import WebhookDispatcher


def test_token_from_the_environment_keeps_the_files_routes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "rootrank.yaml"
    config.write_text(
        "webhooks:\n"
        "  kibana_base_url: https://kibana.example.com\n"
        "  receivers:\n"
        "    chat: {kind: slack, url: 'https://hooks.slack.com/services/T/B/abc'}\n"
        "  routes:\n"
        "    - {match: {job: 'llm-*'}, receivers: [chat]}\n"
        "  delivery: {budget_s: 30}\n"
    )
    monkeypatch.setenv("ROOTRANK_WEBHOOKS__API_TOKEN", "tok-from-env-77")
    settings = load_settings(config)
    webhooks = settings.webhooks
    assert webhooks.api_token is not None and webhooks.api_token.get_secret_value() == "tok-from-env-77"
    assert list(webhooks.receivers) == ["chat"] and len(webhooks.routes) == 1
    assert webhooks.delivery.budget_s == 30 and webhooks.delivery.max_attempts == 12
    assert webhooks.allow_label_webhooks is False
    assert "tok-from-env-77" not in repr(settings) and "tok-from-env-77" not in str(settings.model_dump())
    dispatcher = WebhookDispatcher.from_settings(webhooks)
    assert [r.name for r in dispatcher.routes.receivers.values()] == ["chat"]


def test_a_bad_receiver_in_the_config_stops_start_up_with_where_and_what() -> None:
    settings = load_settings(None, webhooks={"receivers": {"pd": {"kind": "pagerduty", "routing_key": "has spaces!"}}})
    with pytest.raises(ValueError) as err:
        WebhookDispatcher.from_settings(settings.webhooks)
    assert "receiver 'pd': routing_key" in str(err.value)
    assert "has spaces" not in str(err.value)
