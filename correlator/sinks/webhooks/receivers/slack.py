"""Slack incoming webhook: a Block Kit message with the initiator, class, collateral count, fix and link.

The whole incoming-webhook URL is the credential (hooks.slack.com/services/T…/B…/secret), so
it is only ever shown redacted. Limits honoured: header text 150 chars, section text 3000,
field text 2000, 10 fields, `text` is the notification fallback.
"""

from __future__ import annotations

from typing import ClassVar

from correlator.sinks.webhooks.notification import Notification
from correlator.sinks.webhooks.receivers.base import (
    OutboundRequest,
    Receiver,
    ReceiverConfig,
    UrlReceiverConfig,
    clip,
    collateral_ranks,
    dumps,
    initiator_text,
    summary_text,
)

HEADER_LIMIT = 150
SECTION_LIMIT = 3000
FIELD_LIMIT = 2000
MAX_FIX_STEPS = 8

_EMOJI = {"opened": ":rotating_light:", "revised": ":arrows_counterclockwise:", "closed": ":white_check_mark:"}


def escape(text: str) -> str:
    """Slack mrkdwn control characters; log lines are full of `<` and `>`."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code_block(text: str, limit: int) -> str:
    # A ``` inside a log line would end the block early.
    inner = clip(escape(text).replace("```", "'''"), limit - 8)
    return f"```{inner}```"


class SlackConfig(UrlReceiverConfig):
    kind: str = "slack"


def blocks_payload(notification: Notification) -> dict[str, object]:
    inc = notification.incident
    collateral_total = collateral_ranks(inc)
    by_class = ", ".join(f"{escape(entry.class_)} {len(entry.ranks) or entry.count}" for entry in inc.collateral)
    collateral_text = f"*Collateral*\n{collateral_total} ranks" + (f" ({by_class})" if by_class else "")
    fields = [
        {"type": "mrkdwn", "text": clip(f"*Job*\n`{escape(inc.job_id)}`", FIELD_LIMIT)},
        {"type": "mrkdwn", "text": clip(f"*Initiator*\n{escape(initiator_text(inc))}", FIELD_LIMIT)},
        {
            "type": "mrkdwn",
            "text": clip(
                f"*Class*\n`{escape(inc.class_)}` ({inc.severity}, confidence {inc.confidence:.2f})", FIELD_LIMIT
            ),
        },
        {"type": "mrkdwn", "text": clip(collateral_text, FIELD_LIMIT)},
    ]
    blocks: list[dict[str, object]] = [
        {
            "type": "header",
            "text": {
                "type": "plain_text",
                "text": clip(f"{_EMOJI[notification.transition]} {inc.title}", HEADER_LIMIT),
                "emoji": True,
            },
        },
        {"type": "section", "fields": fields},
    ]
    if inc.initiator.line:
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": "*First line*\n" + code_block(inc.initiator.line, SECTION_LIMIT - 20)},
            }
        )
    if inc.fix:
        steps = "\n".join(f"• {escape(step)}" for step in inc.fix[:MAX_FIX_STEPS])
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": clip(f"*Fix*\n{steps}", SECTION_LIMIT)}})
    if notification.link:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open incident"},
                        "url": notification.link,
                    }
                ],
            }
        )
    blocks.append(
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": clip(
                        f"{notification.transition} · incident `{escape(inc.incident_id)}` · revision {inc.revision}",
                        FIELD_LIMIT,
                    ),
                }
            ],
        }
    )
    return {"text": clip(escape(summary_text(notification)), SECTION_LIMIT), "blocks": blocks}


class SlackReceiver(Receiver[SlackConfig]):
    kind: ClassVar[str] = "slack"
    config_model: ClassVar[type[ReceiverConfig]] = SlackConfig

    def render(self, notification: Notification) -> OutboundRequest:
        return OutboundRequest(url=self.config.url, body=dumps(blocks_payload(notification)))
