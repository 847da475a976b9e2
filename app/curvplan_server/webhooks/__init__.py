"""Webhooks: signing secrets, the delivery outbox and the address policy of callbacks."""
