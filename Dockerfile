# syntax=docker/dockerfile:1
# The kvdoctor images, two targets of this one file:
#   sidecar (the default, the last stage): `kvdoctor exporter` and the CLI; no dash, plotly or matplotlib
#   dashboard: the same plus the [dashboard] extra, for `kvdoctor dashboard`
#
#   docker build -t kvdoctor:0.1.0 .
#   docker build --target dashboard -t kvdoctor-dashboard:0.1.0 .
#   bash scripts/build-image.sh [--dashboard]   # the same without Docker (podman or buildah), see README.md
#
# `build` installs kvdoctor into a virtual environment; `build-sidecar` and `build-dashboard` finish
# one environment each (dependencies' test suites and type stubs removed, bytecode compiled, pip
# removed); the final stages copy only that environment onto the same Python base, without pip or
# any build tool, and run as an unprivileged user (uid 65532, the UID the Helm chart's securityContext uses). Nothing is
# written at run time outside /tmp, so a read-only root filesystem works. No HEALTHCHECK: Kubernetes
# probes /healthz and /readyz. The base must be the same in every stage: the environment's python
# links to the base's. REVISION (the source commit) goes into kvdoctor_build_info.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG REVISION=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kvdoctor/ kvdoctor/
COPY exporter/ exporter/
COPY signals/ signals/
COPY ledger/ ledger/
COPY rules/ rules/
COPY sources/ sources/
COPY simulator/ simulator/
COPY stress/ stress/
COPY dashboard/ dashboard/
COPY grafana/ grafana/
# A regular (not editable) install of the sidecar's dependencies only.
RUN python3 -m venv /opt/kvdoctor \
 && /opt/kvdoctor/bin/pip install --no-cache-dir --no-compile . \
 && if [ -n "${REVISION}" ]; then \
      printf '%s\n' "${REVISION}" > "$(/opt/kvdoctor/bin/python -I -c 'import kvdoctor, os; print(os.path.dirname(kvdoctor.__file__))')/REVISION"; \
    fi

FROM build AS build-dashboard
RUN /opt/kvdoctor/bin/pip install --no-cache-dir --no-compile ".[dashboard]" \
 && find /opt/kvdoctor/lib -depth -type d -name tests -exec rm -rf {} + \
 && find /opt/kvdoctor/lib -name '*.pyi' -delete \
 && /opt/kvdoctor/bin/python -m compileall -q /opt/kvdoctor/lib \
 && /opt/kvdoctor/bin/pip uninstall --yes pip setuptools wheel

FROM build AS build-sidecar
RUN find /opt/kvdoctor/lib -depth -type d -name tests -exec rm -rf {} + \
 && find /opt/kvdoctor/lib -name '*.pyi' -delete \
 && /opt/kvdoctor/bin/python -m compileall -q /opt/kvdoctor/lib \
 && /opt/kvdoctor/bin/pip uninstall --yes pip setuptools wheel

FROM ${PYTHON_IMAGE} AS runtime
# The base image's own pip and setuptools are build tools too (a Debian base has none).
RUN if python3 -m pip --version >/dev/null 2>&1; then python3 -m pip uninstall --yes pip setuptools wheel; fi \
 && groupadd --system --gid 65532 kvdoctor \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kvdoctor
# The root filesystem is read-only under the chart: no bytecode writes, caches under /tmp.
ENV PATH="/opt/kvdoctor/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["kvdoctor"]
CMD ["--help"]

FROM runtime AS dashboard
LABEL org.opencontainers.image.title="kvdoctor-dashboard" \
      org.opencontainers.image.description="The kvdoctor dashboard: why LLM decode is slow, per pod" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build-dashboard /opt/kvdoctor /opt/kvdoctor
ENV MPLCONFIGDIR=/tmp/matplotlib
# 8050: the dashboard.
EXPOSE 8050

FROM runtime AS sidecar
LABEL org.opencontainers.image.title="kvdoctor" \
      org.opencontainers.image.description="The kvdoctor exporter sidecar: says why LLM decode is slow" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build-sidecar /opt/kvdoctor /opt/kvdoctor
# 9745: the exporter (/metrics, /healthz, /readyz, /api/v1).
EXPOSE 9745
