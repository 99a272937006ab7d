"""Webhook notifications: one per incident transition, routed per job, signed, retried, dead-lettered.

The delivery logic is plain asyncio (`correlator.sinks.webhooks.dispatcher.WebhookDispatcher.handle`);
the faust agent in `correlator.sinks.webhooks.agent` is a thin shell around it. Submodules are
imported where used, so loading the config does not pull in the HTTP client.
"""
