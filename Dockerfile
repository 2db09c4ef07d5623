# trace-rollout service image.
#   CPU (default):  docker build -t trace-rollout:0.1.0 .
#   CUDA:           docker build -t trace-rollout:0.1.0-cuda \
#                     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
# PyTorch's CUDA wheels bundle the CUDA runtime, so one slim base serves both; the host only needs the
# NVIDIA driver; pick a CUDA index that carries TORCH_VERSION. The build context needs
# proto/openapi.v1.json, the committed OpenAPI document of the wire contract.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# torch first, from the chosen index: installing the project first would pull PyPI's default build.
RUN python -m venv /opt/venv \
    && pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto/trace_proto proto/trace_proto
COPY client/trace_client client/trace_client
COPY lab/trace_lab lab/trace_lab
COPY service/trace_service service/trace_service
# tracing: spans go out only when the OTEL_* variables ask for them.
RUN pip install "/src[service,tracing]"

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="trace-rollout" \
      org.opencontainers.image.description="TRACE rollout allocation service for RL trainers of LLM agents" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 trace \
    && useradd --system --uid 10001 --gid trace --no-create-home --shell /usr/sbin/nologin trace
COPY --from=builder /opt/venv /opt/venv
COPY proto/openapi.v1.json /opt/trace-rollout/openapi.v1.json
# HOME=/tmp: the root filesystem is read-only in Kubernetes and /tmp is the writable emptyDir there.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=3)"]
ENTRYPOINT ["trace-rollout", "serve", "--host", "0.0.0.0", "--port", "8000"]
