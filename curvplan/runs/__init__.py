"""Training runs as plan measurements: a tracker's runs (MLflow, or any tracker's CSV or
JSON-lines export) turned into ``measurements.steps_to_target``,
``measurements.loss_vs_data`` and, for runs at several token counts,
``measurements.batch_sweeps`` (``curvplan plan --from-mlflow`` / ``--from-runs``;
docs/integrations.md#pilot-runs-from-a-tracker).

    from curvplan.runs import ParamNames, build_tables, read_runs_file

    result = build_tables(read_runs_file(Path("runs.csv")), target_loss=2.0)
    result.measurements()  # {"steps_to_target": [...], "loss_vs_data": [...], ...}
    result.report()        # which runs were used, which skipped and why

Torch-free, numpy-free and MLflow-free (``curvplan.integrations.mlflow_runs`` reads MLflow);
pydantic only, for the plan's own input models.
"""

from curvplan.runs.export_file import LOSS_COLUMNS, read_runs_file
from curvplan.runs.records import (
    DEFAULT_PARAM_NAMES,
    ROLES,
    ParamNames,
    ResolvedRun,
    RunRecord,
    RunsInputError,
    resolve_run,
)
from curvplan.runs.sweeps import GroupOutcome, SizeGroup, build_batch_sweeps
from curvplan.runs.tables import (
    Crossing,
    ImportResult,
    RunOutcome,
    build_tables,
    clean_history,
    first_crossing,
)

__all__ = [
    "DEFAULT_PARAM_NAMES",
    "LOSS_COLUMNS",
    "ROLES",
    "Crossing",
    "GroupOutcome",
    "ImportResult",
    "ParamNames",
    "ResolvedRun",
    "RunOutcome",
    "RunRecord",
    "RunsInputError",
    "SizeGroup",
    "build_batch_sweeps",
    "build_tables",
    "clean_history",
    "first_crossing",
    "read_runs_file",
    "resolve_run",
]
