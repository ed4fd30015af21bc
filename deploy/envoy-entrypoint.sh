#!/bin/sh
# Entry point of the balancer image: render the Envoy configuration template
# (deploy/envoy.yaml, mounted or baked in at $ENVOY_TEMPLATE) with deploy/render-envoy.py
# into /tmp, then run Envoy on it. The template's placeholders come from the environment
# (TENSOROPS_UPSTREAMS, ENVOY_LISTEN_PORT, ENVOY_ADMIN_PORT, ...); extra arguments go to
# Envoy (e.g. --log-level debug). Only /tmp is written: the root filesystem may be read-only.
set -eu
template=${ENVOY_TEMPLATE:-/etc/envoy/envoy.yaml}
config=${ENVOY_CONFIG:-/tmp/envoy.yaml}
python3 /usr/local/lib/tensorops/render-envoy.py --template "$template" -o "$config"
exec envoy -c "$config" --disable-hot-restart "$@"
