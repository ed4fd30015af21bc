#!/usr/bin/env python3
"""Render deploy/envoy.yaml (the Envoy configuration template) into a file Envoy can load.

    TENSOROPS_UPSTREAMS=tensorops:50051 python3 deploy/render-envoy.py -o /etc/envoy/envoy.yaml
    python3 deploy/render-envoy.py --upstreams 127.0.0.1:50061,127.0.0.1:50062 --listen-port 50060

Each ${NAME} in the template is replaced by the option of that name, else the environment
variable, else its default (below). The endpoint line, the one holding ${UPSTREAM_HOST}, is
written once per host:port of --upstreams / TENSOROPS_UPSTREAMS. A placeholder left
unfilled is an error. Standard library only, Python 3.8+."""

import argparse
import os
import re
import sys

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "envoy.yaml")
DEFAULTS = {
    "TENSOROPS_UPSTREAMS": "tensorops:50051",
    "ENVOY_LISTEN_ADDRESS": "0.0.0.0",
    "ENVOY_LISTEN_PORT": "50051",
    "ENVOY_ADMIN_PORT": "9901",
}
PLACEHOLDER = re.compile(r"\$\{([A-Z0-9_]+)\}")


def upstreams(text):
    """[(host, port)] from "host:port,host:port" ([v6]:port accepted)."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"upstream {item!r}: expected host:port")
        out.append((host.strip("[]"), port))
    if not out:
        raise ValueError("no upstream given")
    return out


def render(template, values):
    """The template with its placeholders filled; the endpoint line repeated per upstream."""
    hosts = upstreams(values["TENSOROPS_UPSTREAMS"])
    lines = []
    for line in template.splitlines(keepends=True):
        if line.lstrip().startswith("#"):
            lines.append(line)
        elif "${UPSTREAM_HOST}" in line:
            for host, port in hosts:
                lines.append(line.replace("${UPSTREAM_HOST}", host).replace("${UPSTREAM_PORT}", port))
        else:
            lines.append(PLACEHOLDER.sub(lambda m: fill(m.group(1), values), line))
    return "".join(lines)


def fill(name, values):
    if name not in values:
        raise ValueError(f"the template uses ${{{name}}}, which has no value")
    return values[name]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--template", default=TEMPLATE, help="template file (default: envoy.yaml next to this script)")
    p.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    for name, default in DEFAULTS.items():
        flag = "--" + name.lower().replace("tensorops_", "").replace("envoy_", "").replace("_", "-")
        p.add_argument(flag, dest=name, help=f"[{name}, default {default}]")
    args = p.parse_args(argv)
    values = {name: getattr(args, name) or os.environ.get(name) or default for name, default in DEFAULTS.items()}
    with open(args.template) as f:
        template = f.read()
    try:
        text = render(template, values)
    except ValueError as exc:
        p.error(str(exc))
    if args.output == "-":
        sys.stdout.write(text)
    else:
        tmp = args.output + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, args.output)  # Envoy never reads a half-written file
    return 0


if __name__ == "__main__":
    sys.exit(main())
