"""The curvature engine: blockwise Hessians of Transformers at w*.

Importing this package imports torch; the service and the CLI import it lazily.
Public entry points: :func:`curvplan_worker.curvature.model.build_model`,
:func:`curvplan_worker.curvature.objective.objective_for`,
:func:`curvplan_worker.curvature.analyze.analyze`.
"""
