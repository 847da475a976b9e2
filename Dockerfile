# syntax=docker/dockerfile:1
# Two images from one file:
#   docker build --target api    -t curvplan-api .     # FastAPI service, no torch
#   docker build --target worker -t curvplan-worker .  # worker with torch (CUDA build from PyPI)

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
# A regular (non-editable) install: the migrations ship inside the wheel.
COPY pyproject.toml setup.py README.md LICENSE ./
COPY alembic ./alembic
COPY app ./app
COPY workers ./workers
COPY curvplan ./curvplan

FROM base AS api
RUN pip install '.[server]'
USER curvplan
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)" || exit 1
CMD ["curvplan", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]

FROM base AS worker
# torch first, pinned, so the project's `worker` extra cannot pull another version.
COPY scripts/constraints.txt ./scripts/constraints.txt
RUN pip install "torch==2.13.0" \
    && pip install -c scripts/constraints.txt '.[worker]'
USER curvplan
CMD ["curvplan", "worker", "--queues", "gpu"]
