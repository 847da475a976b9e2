"""An Airflow DAG: get a data budget from curvplan between a pilot run and the full run.

The step runs the client-only image (``docker build --target client -t curvplan-client .``,
the ``curvplan`` CLI and nothing else) with ``analyze … --wait --json``; the Airflow
environment needs no curvplan package. The job's JSON goes to the pod's XCom file, the next
task reads the budget from it. Exit codes of the step are the CLI's: 1 (the job failed)
fails the task for good, 3 (service unreachable) and 4 (timed out) are worth a retry; the
idempotency key makes a retried task wait for the same job instead of submitting another.

Needs apache-airflow and apache-airflow-providers-cncf-kubernetes (not curvplan's
dependencies).
"""

from __future__ import annotations

from datetime import datetime

from airflow.decorators import dag, task
from airflow.exceptions import AirflowFailException
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.secret import Secret
from kubernetes.client import models as k8s

IMAGE = "curvplan-client:latest"
PILOT = "/pilot"  # the pilot run's checkpoint and evaluation data (a read-only volume)
ANALYZE = [
    "curvplan", "analyze",
    "--spec", f"{PILOT}/spec.json",
    "--checkpoint", f"{PILOT}/checkpoint.safetensors",
    "--data", f"{PILOT}/eval.safetensors",
    "--name", "{{ dag.dag_id }}",
    "--idempotency-key", "{{ run_id }}",
    "--wait", "--timeout", "3600", "--json", "--quiet",
]  # fmt: skip


@dag(schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["curvplan"])
def data_budget() -> None:
    analyze = KubernetesPodOperator(
        task_id="curvplan_analyze",
        name="curvplan-analyze",
        image=IMAGE,
        cmds=["sh", "-c"],  # the shell only redirects: its exit code is the CLI's
        arguments=[" ".join(ANALYZE) + " > /airflow/xcom/return.json"],
        env_vars={"CURVPLAN_URL": "{{ var.value.curvplan_url }}"},
        secrets=[Secret("env", "CURVPLAN_API_KEY", "curvplan", "api-key")],
        volumes=[
            k8s.V1Volume(
                name="pilot",
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
                    claim_name="pilot-run"
                ),
            )
        ],
        volume_mounts=[k8s.V1VolumeMount(name="pilot", mount_path=PILOT, read_only=True)],
        do_xcom_push=True,
        retries=2,
    )

    @task
    def budget(job: dict) -> dict[str, float]:
        if job["status"] != "succeeded":
            raise AirflowFailException(f"curvplan job {job['id']} {job['status']}")
        budget = job["result"]["recommendation"]["budget"]  # the one batch answer
        return {
            "batch_size": budget["batch"]["recommended"],
            "critical_batch_size": budget["batch"]["critical"],
        }

    budget(analyze.output)


data_budget()
