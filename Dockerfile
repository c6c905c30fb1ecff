# syntax=docker/dockerfile:1
# The kvdoctor image: one image for `kvdoctor exporter` (the sidecar) and `kvdoctor dashboard`.
#
#   docker build -t kvdoctor:0.1.0 .
#   docker run --rm kvdoctor:0.1.0 exporter --engine-url http://host.docker.internal:8000/metrics
#
# Two stages: `build` installs kvdoctor and its dependencies into a virtual environment; the final
# stage copies only that environment onto the same slim Python base, without pip or any build
# tool, and runs as an unprivileged user (uid 65532, the UID the Helm chart's securityContext uses).
# Both stages must use the same base image: the environment's python links to the base's.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kvdoctor/ kvdoctor/
COPY exporter/ exporter/
COPY rules/ rules/
COPY sources/ sources/
COPY simulator/ simulator/
COPY stress/ stress/
COPY dashboard/ dashboard/
# A regular (not editable) install; pip, setuptools and wheel leave the environment afterwards.
RUN python -m venv /opt/kvdoctor \
 && /opt/kvdoctor/bin/pip install --no-cache-dir . \
 && /opt/kvdoctor/bin/python -m compileall -q /opt/kvdoctor/lib \
 && /opt/kvdoctor/bin/pip uninstall --yes pip setuptools wheel

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kvdoctor" \
      org.opencontainers.image.description="Says why LLM decode is slow: exporter and dashboard" \
      org.opencontainers.image.licenses="Apache-2.0"
# The base image's own pip and setuptools are build tools too: the final image has none.
RUN python -m pip uninstall --yes pip setuptools wheel \
 && groupadd --system --gid 65532 kvdoctor \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kvdoctor
COPY --from=build /opt/kvdoctor /opt/kvdoctor
# The root filesystem is read-only under the chart: no bytecode writes, caches under /tmp.
ENV PATH="/opt/kvdoctor/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
# 9745: the exporter (/metrics, /healthz, /readyz, /api/v1); 8050: the dashboard.
EXPOSE 9745 8050
ENTRYPOINT ["kvdoctor"]
CMD ["--help"]
