# specdec-exporter container image.
#   docker build -t specdec-exporter .
#   docker run -p 9400:9400 -v $PWD/exporter.yaml:/etc/specdec/exporter.yaml:ro \
#     -v specdec-data:/data specdec-exporter
# Two stages: `build` installs into /venv (dependencies in their own layer, cached until
# deploy/constraints.txt changes; the code after them), the runtime stage copies /venv only.
# The base image is pinned to an exact Python and Debian release; CI bumps it on purpose.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /venv
# Dependencies first: this layer changes only with the pinned runtime dependencies and the
# pinned build backend (setuptools, installed here so the package builds without fetching one).
COPY deploy/constraints.txt /tmp/constraints.txt
RUN /venv/bin/pip install --requirement /tmp/constraints.txt
# Then the code: an edit to exporter/ rebuilds from here on only.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN /venv/bin/pip install --no-deps --no-build-isolation --constraint /tmp/constraints.txt . \
    && /venv/bin/pip check

FROM ${PYTHON_IMAGE}
ARG VERSION=0.0.0+local
ARG REVISION=unknown
ARG SOURCE=https://github.com/specdec-exporter/specdec-exporter
LABEL org.opencontainers.image.title="specdec-exporter" \
      org.opencontainers.image.description="Prometheus exporter and benchmark-window recorder for vLLM speculative-decoding counters" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/venv/bin:$PATH

# A fixed numeric uid/gid so Kubernetes' runAsNonRoot can check it without a passwd lookup.
RUN groupadd --system --gid 10001 specdec \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin specdec \
    && mkdir -p /data /etc/specdec \
    && chown 10001:10001 /data
COPY --from=build /venv /venv

WORKDIR /data
ENV SPECDEC_CONFIG=/etc/specdec/exporter.yaml \
    SPECDEC_LISTEN=0.0.0.0:9400
USER 10001:10001
VOLUME /data
EXPOSE 9400

# No curl in the slim image: probe with the standard library, straight to loopback (no proxy
# from HTTP_PROXY: a proxy cannot reach the container's loopback). Error or non-2xx exits 1.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; port = os.environ.get('SPECDEC_LISTEN', '0.0.0.0:9400').rsplit(':', 1)[-1]; u.build_opener(u.ProxyHandler({})).open(f'http://127.0.0.1:{port}/-/healthy', timeout=4)"]

ENTRYPOINT ["specdec-exporter"]
CMD ["serve"]
