# syntax=docker/dockerfile:1
# The vllm-headroom image: the package installed from its wheel on Debian's slim Python, run as a
# non-root user. Build from the repository root:
#
#   docker build -t vllm-headroom:0.1.0 .
#   podman build --format docker -t vllm-headroom:0.1.0 .     # --format docker keeps HEALTHCHECK
#   scripts/image/build.sh       # no registry: podman on a debootstrap base (docs/kubernetes.md)
#
# Stage "build" makes our wheel (the same `pip wheel --no-deps` tests/test_helm.py runs) and the
# wheels of its dependencies; the final stage installs only those wheels: no compiler, no source
# tree, no pip cache. Pin the base by digest in your pipeline:
#   --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest>
# Behind a corporate mirror or TLS-intercepting proxy, only the build stage reaches the network:
#   --build-arg PIP_INDEX_URL=https://pypi.example.com/simple   (also PIP_EXTRA_INDEX_URL,
#       PIP_TRUSTED_HOST; build args of the build stage only, not in the image's history)
#   --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt      (a full CA bundle pip trusts; a
#       secret is mounted for that one RUN and never becomes a layer)

# checkov's CKV_DOCKER_7 ("a non latest version tag") cannot see through the ARG below:
# checkov:skip=CKV_DOCKER_7:the base is the PYTHON_IMAGE build argument, python 3.11-slim-bookworm by default, to be pinned by digest in your pipeline
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
RUN --mount=type=secret,id=ca,required=false \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && pip wheel --no-deps --wheel-dir /wheels . \
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
