# The onceflow application image: one image, three processes (ingest, worker, engine),
# chosen by the command: `docker run onceflow ingest`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    ONCEFLOW_STATE_DIR=/tmp/onceflow \
    ONCEFLOW_INGEST_HOST=0.0.0.0

WORKDIR /app
COPY pyproject.toml README.md ./
COPY onceflow ./onceflow
COPY producers ./producers
COPY streams ./streams
COPY workflow_engine ./workflow_engine
RUN pip install . && useradd --system --uid 10001 --home-dir /tmp onceflow

USER 10001
EXPOSE 8080 9101 9102 9103
ENTRYPOINT ["onceflow"]
CMD ["--help"]
