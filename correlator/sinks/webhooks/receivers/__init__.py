"""Receiver kinds, one module each; each declares its config as a pydantic model."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from correlator.sinks.webhooks.receivers.alertmanager import AlertmanagerReceiver
from correlator.sinks.webhooks.receivers.base import OutboundRequest, Receiver, ReceiverConfig
from correlator.sinks.webhooks.receivers.generic_json import GenericJsonReceiver
from correlator.sinks.webhooks.receivers.pagerduty import PagerDutyReceiver
from correlator.sinks.webhooks.receivers.slack import SlackReceiver

RECEIVER_KINDS: dict[str, type[Receiver[Any]]] = {
    cls.kind: cls for cls in (GenericJsonReceiver, SlackReceiver, PagerDutyReceiver, AlertmanagerReceiver)
}


def build_receiver(name: str, raw: dict[str, Any]) -> Receiver[Any]:
    """A receiver from its config mapping (`kind` selects the module, default generic_json).

    Raises ValueError with `where: what` problems; never the offending values, since those
    may be secrets (pydantic's own message would echo the raw input).
    """
    kind = raw.get("kind", "generic_json")
    cls = RECEIVER_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"receiver {name!r}: unknown kind {kind!r} (known: {', '.join(sorted(RECEIVER_KINDS))})")
    try:
        config = cls.config_model.model_validate({**raw, "kind": kind})
    except ValidationError as exc:
        raise ValueError("; ".join(f"receiver {name!r}: {problem}" for problem in safe_errors(exc))) from None
    return cls(name, config)


def safe_errors(exc: ValidationError) -> list[str]:
    """`field: message` for each problem, without pydantic's `input_value=` echo of the input."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        where = ".".join(str(part) for part in error["loc"]) or "value"
        problems.append(f"{where}: {error['msg']}")
    return problems


__all__ = ["RECEIVER_KINDS", "OutboundRequest", "Receiver", "ReceiverConfig", "build_receiver", "safe_errors"]
