"""Credentials: project API keys and service keys (operators, workers) — their tables, hashing,
creation, lookup and revocation. The HTTP side (Bearer headers, 401/403) is the server's."""
