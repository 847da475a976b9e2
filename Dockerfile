# syntax=docker/dockerfile:1
# Three images from one file:
#   docker build --target api    -t curvplan-api .     # FastAPI service, no torch
#   docker build --target worker -t curvplan-worker .  # worker with torch (CUDA build from PyPI)
#   docker build --target client -t curvplan-client .  # the `curvplan` CLI only, for pipeline
#       steps (Airflow, Argo/Kubeflow, CI); --build-arg CLIENT_EXTRAS=mlflow adds --mlflow
#
# Layer order for the build cache: the dependencies (each image's lock, requirements/*.txt:
# every package pinned with its sha256 hashes, installed with --require-hashes) are installed
# before the source is copied, so a code change rebuilds only the last layers. The project
# itself is a regular (non-editable) install without dependencies: the migrations ship in the
# wheel.

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CURVPLAN_LOG_FORMAT=json \
    CURVPLAN_DATA_DIR=/data
RUN useradd --system --uid 10001 --create-home curvplan \
    && mkdir -p /data && chown curvplan /data
WORKDIR /srv/curvplan

FROM base AS api
# The server extra's dependency closure only (no torch), each package pinned with its hashes.
COPY requirements/server.txt ./requirements/
RUN pip install --require-hashes -r requirements/server.txt
COPY pyproject.toml setup.py README.md LICENSE ./
COPY alembic ./alembic
COPY app ./app
COPY workers ./workers
COPY curvplan ./curvplan
RUN pip install --no-deps '.[server]' && rm -rf build *.egg-info
USER curvplan
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)" || exit 1
CMD ["curvplan", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]

FROM base AS worker
# The worker extra's closure: torch==2.13.0 from PyPI (the CUDA build) with its CUDA wheels
# (nvidia-*, triton), each pinned with its hashes like every other package.
COPY requirements/worker.txt ./requirements/
RUN pip install --require-hashes -r requirements/worker.txt
COPY pyproject.toml setup.py README.md LICENSE ./
COPY alembic ./alembic
COPY app ./app
COPY workers ./workers
COPY curvplan ./curvplan
RUN pip install --no-deps '.[worker]' && rm -rf build *.egg-info
# The worker touches this file after every heartbeat that reached the database.
ENV CURVPLAN_WORKER_HEALTH_FILE=/tmp/curvplan-worker.alive
USER curvplan
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["curvplan", "worker-health", "--max-age", "60"]
CMD ["curvplan", "worker", "--queues", "gpu"]

# The pipeline step: the client and its CLI only (pydantic, httpx, typer): no torch, no
# server dependencies. `docker run curvplan-client analyze … --wait --json`; exit codes:
# 0 succeeded · 1 job failed/cancelled · 2 bad input · 3 service unreachable · 4 timeout.
FROM python:3.11-slim AS client
ARG CLIENT_EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --system --uid 10001 --create-home curvplan
WORKDIR /srv/curvplan
# The base install's dependencies (or the lock of CLIENT_EXTRAS: requirements/mlflow.txt),
# each pinned with its hashes, before the source.
COPY requirements/base.txt requirements/mlflow.txt ./requirements/
RUN pip install --require-hashes -r "requirements/${CLIENT_EXTRAS:-base}.txt"
COPY pyproject.toml setup.py README.md LICENSE ./
COPY alembic ./alembic
COPY app ./app
COPY workers ./workers
COPY curvplan ./curvplan
RUN pip install --no-deps . \
    && cd / && rm -rf /srv/curvplan \
    && python -c "import curvplan.cli, curvplan.client, curvplan.webhooks"
USER curvplan
WORKDIR /work
ENTRYPOINT ["curvplan"]
CMD ["--help"]
