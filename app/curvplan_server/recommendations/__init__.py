"""``GET /v1/recommendations``: the latest succeeded recommendation per job name."""
