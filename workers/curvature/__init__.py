"""The curvature engine: blockwise Hessians of Transformers at w* (issue 4).

Importing this package imports torch; the service and the CLI import it lazily.
Public entry points: :func:`workers.curvature.model.build_model`,
:func:`workers.curvature.objective.objective_for`, :func:`workers.curvature.api.analyze`.
"""
