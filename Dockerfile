# syntax=docker/dockerfile:1
# The vllm-headroom image: the package installed from its wheel on Debian's slim Python, run as a
# non-root user. Build from the repository root:
#
#   docker build -t vllm-headroom:0.1.0 .
#
# Stage "build" makes our wheel (the same `pip wheel --no-deps` tests/test_helm.py runs) and the
# wheels of its dependencies; the final stage installs only those wheels: no compiler, no source
# tree, no pip cache. Pin the base by digest in your pipeline:
#   --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest>

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && pip wheel --wheel-dir /wheels /wheels/vllm_headroom-*.whl

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="vllm-headroom" \
      org.opencontainers.image.description="KV-cache capacity, real-traffic headroom and GPU memory for vLLM, as Prometheus metrics" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# The wheels are bind-mounted from the build stage, so they never become a layer of this image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels vllm-headroom \
 && groupadd --system --gid 65532 headroom \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin headroom
# Numeric, so that Kubernetes' runAsNonRoot can verify it; the chart runs vLLM as the same UID.
USER 65532:65532
WORKDIR /
EXPOSE 8742
# Docker only (Kubernetes uses the chart's probes): the process answers on its port.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/-/healthy' % os.environ.get('HEADROOM_PORT', '8742'), timeout=4)"]
ENTRYPOINT ["vllm-headroom"]
CMD ["serve"]
