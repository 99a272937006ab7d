"""Routes from the config file: which configured receivers an incident goes to.

```yaml
webhooks:
  receivers:
    ml-slack: {kind: slack, url: "https://hooks.slack.com/services/..."}
    oncall:   {kind: pagerduty, routing_key: "..."}
  routes:
    - match: {job: ["llm-*"], labels: {team: "ml-*"}, class: [cuda_oom, "nccl_*"], min_severity: high}
      receivers: [ml-slack, oncall]
      continue: true      # keep matching later routes (default: first match wins, as in Alertmanager)
```
Every condition given must hold; values are shell-style globs (fnmatch, case-sensitive).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from correlator.diagnosis.models import Incident, Severity
from correlator.sinks.webhooks.notification import severity_at_least
from correlator.sinks.webhooks.receivers import Receiver, build_receiver, safe_errors


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class RouteMatch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    job: list[str] = Field(default_factory=list, description="job id globs; any may match")
    labels: dict[str, str] = Field(default_factory=dict, description="label -> value glob; all must match")
    classes: list[str] = Field(default_factory=list, alias="class", description="class globs; any may match")
    severity: list[Severity] = Field(default_factory=list, description="exact severities; any may match")
    min_severity: Severity | None = None

    _listify = field_validator("job", "classes", "severity", mode="before")(_as_list)

    def matches(self, incident: Incident) -> bool:
        if self.job and not any(fnmatchcase(incident.job_id, pattern) for pattern in self.job):
            return False
        for key, pattern in self.labels.items():
            value = incident.labels.get(key)
            if value is None or not fnmatchcase(value, pattern):
                return False
        if self.classes and not any(fnmatchcase(incident.class_, pattern) for pattern in self.classes):
            return False
        if self.severity and incident.severity not in self.severity:
            return False
        return severity_at_least(incident.severity, self.min_severity)


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str | None = None
    match: RouteMatch = Field(default_factory=RouteMatch)
    receivers: list[str] = Field(min_length=1)
    continue_: bool = Field(default=False, alias="continue")

    _listify = field_validator("receivers", mode="before")(_as_list)


class RouteTable:
    """Configured receivers and the ordered routes that select them."""

    def __init__(self, routes: list[Route], receivers: dict[str, Receiver[Any]]) -> None:
        for index, route in enumerate(routes):
            for name in route.receivers:
                if name not in receivers:
                    label = route.name or f"routes[{index}]"
                    raise ValueError(f"{label}: unknown receiver {name!r} (configured: {', '.join(sorted(receivers))})")
        self.routes = routes
        self.receivers = receivers

    @classmethod
    def from_config(cls, routes: list[dict[str, Any]], receivers: dict[str, dict[str, Any]]) -> RouteTable:
        built = {name: build_receiver(name, raw) for name, raw in receivers.items()}
        parsed: list[Route] = []
        for index, raw in enumerate(routes):
            try:
                parsed.append(Route.model_validate(raw))
            except ValidationError as exc:
                raise ValueError("; ".join(f"routes[{index}].{p}" for p in safe_errors(exc))) from None
        return cls(parsed, built)

    def receivers_for(self, incident: Incident) -> list[Receiver[Any]]:
        """Receivers of the matching routes, in route order, each once."""
        chosen: dict[str, Receiver[Any]] = {}
        for route in self.routes:
            if not route.match.matches(incident):
                continue
            for name in route.receivers:
                chosen.setdefault(name, self.receivers[name])
            if not route.continue_:
                break
        return list(chosen.values())
