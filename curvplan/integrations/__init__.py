"""Connections to the tools ML teams already run (MLflow: ``curvplan.integrations.mlflow``)."""
