"""The client tests use the shared live service (``live``, tests/live_plugin.py)."""
