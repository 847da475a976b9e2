"""Rate limits of submissions and failed authentication (docs/operations.md#rate-limits)."""
