# A small image for sluice workers, Flower and the autoscaler; install your app on top of it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HOME=/tmp SLUICE_HOME=/tmp/sluice

WORKDIR /opt/sluice
COPY pyproject.toml README.md ./
COPY src ./src
# The kubernetes extra: the autoscaler Deployment (`sluice autoscale`) runs in this image too.
RUN pip install ".[kubernetes]" && rm -rf /root/.cache

# Non-root, matching the pods' runAsUser; the root filesystem can be read-only (writes go to /tmp).
RUN useradd --uid 10001 --user-group --home-dir /tmp --no-create-home sluice
USER 10001:10001

CMD ["sluice", "--help"]
