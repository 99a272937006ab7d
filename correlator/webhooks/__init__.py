"""Webhook notifications: one per incident transition, routed per job, signed, retried, dead-lettered.

The delivery logic is plain asyncio (`WebhookDispatcher.handle(incident)`); the faust agent in
`correlator.agents.webhook_sink` is a thin shell around it.
"""

from correlator.webhooks.dispatcher import WebhookDispatcher
from correlator.webhooks.notification import Notification, Transition, delivery_id_for, transition_of

__all__ = ["Notification", "Transition", "WebhookDispatcher", "delivery_id_for", "transition_of"]
