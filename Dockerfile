# The onceflow application image: one image, three processes (ingest, worker, engine),
# chosen by the command: `docker run onceflow ingest`.
#
# Two targets:
#   runtime  (the default, last stage) — the product only: the onceflow distribution
#            (core, CLI, ingest, worker, engine, store). No tools, no sample workflows:
#            bring your own workflow modules (FROM this image, pip install yours, list
#            them in ONCEFLOW_WORKFLOW_MODULES).
#   examples — runtime plus the opt-in sample workflows (onceflow-examples), which
#            docker-compose.yml builds so the stack has something to run.
# The tools (tools/: dev services, demo, bench, chaos) never enter an image.

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    ONCEFLOW_STATE_DIR=/tmp/onceflow \
    ONCEFLOW_INGEST_HOST=0.0.0.0
WORKDIR /app
COPY pyproject.toml README.md ./
COPY onceflow ./onceflow
COPY onceflow_cli ./onceflow_cli
COPY producers ./producers
COPY streams ./streams
COPY workflow_engine ./workflow_engine
COPY console ./console
RUN pip install . && useradd --system --uid 10001 --home-dir /tmp onceflow
EXPOSE 8080 8090 9101 9102 9103 9104
ENTRYPOINT ["onceflow"]
CMD ["--help"]

FROM base AS examples
COPY examples ./examples
RUN pip install ./examples
USER 10001

FROM base AS runtime
USER 10001
