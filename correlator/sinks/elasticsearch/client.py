"""The Elasticsearch client rootrank's sink and CLI use, made from `ElasticsearchSettings`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elasticsearch import Elasticsearch

    from correlator.config import ElasticsearchSettings


def make_client(es: ElasticsearchSettings, *, request_timeout_s: float | None = None, max_retries: int = 0) -> Elasticsearch:
    """A client from the settings. The sink does its own retries (with backoff and a stop signal),
    so the client's are off by default."""
    from elasticsearch import Elasticsearch

    kwargs: dict[str, Any] = {
        "request_timeout": request_timeout_s if request_timeout_s is not None else es.request_timeout_s,
        "max_retries": max_retries,
        "retry_on_timeout": max_retries > 0,
    }
    if es.api_key:
        kwargs["api_key"] = es.api_key
    elif es.username:
        kwargs["basic_auth"] = (es.username, es.password or "")
    if es.ca_certs:
        kwargs["ca_certs"] = es.ca_certs
    if not es.verify_certs:
        kwargs["verify_certs"] = False
        kwargs["ssl_show_warn"] = False
    return Elasticsearch(es.url, **kwargs)
