# specdec-exporter container image.
#   docker build -t specdec-exporter .
#   docker run -p 9400:9400 -v $PWD/exporter.yaml:/etc/specdec/exporter.yaml:ro \
#     -v specdec-data:/data specdec-exporter
# Runtime dependencies are pinned by deploy/constraints.txt.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY deploy/constraints.txt /tmp/constraints.txt
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip install --constraint /tmp/constraints.txt . \
    && rm -rf /src /tmp/constraints.txt

# A fixed numeric uid/gid so Kubernetes' runAsNonRoot can check it without a passwd lookup.
RUN groupadd --system --gid 10001 specdec \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin specdec \
    && mkdir -p /data /etc/specdec \
    && chown 10001:10001 /data

WORKDIR /data
ENV SPECDEC_CONFIG=/etc/specdec/exporter.yaml \
    SPECDEC_LISTEN=0.0.0.0:9400
USER 10001:10001
VOLUME /data
EXPOSE 9400

# No curl in the slim image: probe with the standard library. Any error or non-2xx exits 1.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('SPECDEC_LISTEN', '0.0.0.0:9400').rsplit(':', 1)[-1]; urllib.request.urlopen(f'http://127.0.0.1:{port}/-/healthy', timeout=4)"]

ENTRYPOINT ["specdec-exporter"]
CMD ["serve"]
