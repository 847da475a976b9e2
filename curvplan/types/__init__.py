"""The curvplan contract: every model that crosses a boundary, torch-free.

The API (``curvplan_server``), the workers and the curvature engine
(``curvplan_worker``), the planner and the client (``curvplan.client``) all import
these models and nothing of each other's internals:

- :mod:`curvplan.types.spec` — the reference Transformer's model spec;
- :mod:`curvplan.types.huggingface` — Hugging Face ``config.json`` sources (supported
  architectures, refusals, parameter counts);
- :mod:`curvplan.types.model_source` — an analyze request's ``model``: either of the above;
- :mod:`curvplan.types.artifact_inputs` — checkpoint references (one id or shards) and the
  two dataset layouts;
- :mod:`curvplan.types.options` — analysis options;
- :mod:`curvplan.types.planner` — measurements, targets and the recommendation;
- :mod:`curvplan.types.jobs` — job requests and responses, and the registry of job kinds;
- :mod:`curvplan.types.artifacts` — artifact metadata;
- :mod:`curvplan.types.storage` — a project's storage usage and quota;
- :mod:`curvplan.types.recommendations` — the latest-recommendation listing;
- :mod:`curvplan.types.reports` — the figures of a job's report;
- :mod:`curvplan.types.problems` — RFC 9457 problem documents.

Only pydantic (and the standard library) is imported here.
"""
