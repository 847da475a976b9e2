"""The ``analyze`` job's API side: its options and the checks that run before it is queued.

Torch-free: the model spec is validated with the engine's own pydantic ``ModelSpec``
(``curvplan/types/spec.py`` imports only pydantic), artifact ids against the database.
"""
