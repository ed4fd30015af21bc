"""Fixtures of the deployment tests. The container tests need a Docker engine: `make
test-deploy` starts a private one and sets TENSOROPS_DEPLOY_TESTS=1, under which a missing
engine or tool is a failure, never a skip. Elsewhere (a plain `pytest tests`) they are
skipped with that reason."""
from __future__ import annotations

import os
import sys
import time

import pytest

from dockertools import BASE_IMAGE, DEPLOY, ENVOY_IMAGE, ROOT, SERVER_IMAGE, STEPS, docker, engine_problem, \
    extra_ca_pem, require, run

sys.path.insert(0, str(ROOT / "tests" / "e2e"))  # rpc_cases: the operations and their arguments

@pytest.fixture(scope="session")
def engine():
    problem = engine_problem()
    require(problem is None, f"container tests need a Docker engine (run `make test-deploy`): {problem}")
    version = docker("version", "--format", "{{.Server.Version}}").stdout.strip()
    STEPS.note(f"Docker engine {version} at {os.environ.get('DOCKER_HOST', 'the default socket')}")
    return version


@pytest.fixture(scope="session")
def base_image(engine):
    """debian:bookworm-slim in the engine: pulled by nobody (no registry here), bootstrapped
    once by deploy/scripts/base-image.sh and cached."""
    with STEPS.timed("base image (debootstrap or cache)"):
        if docker("image", "inspect", BASE_IMAGE, check=False).returncode != 0:
            run(str(DEPLOY / "scripts" / "base-image.sh"), BASE_IMAGE, timeout=1200)
    return BASE_IMAGE


@pytest.fixture(scope="session")
def build_args():
    ca = extra_ca_pem()
    return ["--build-arg", f"EXTRA_CA_CERT={ca}"] if ca else []


def build(dockerfile: str, tag: str, build_args, *extra) -> float:
    start = time.monotonic()
    docker("build", "-f", dockerfile, "-t", tag, *build_args, *extra, ".", timeout=1500)
    return time.monotonic() - start


@pytest.fixture(scope="session")
def server_image(base_image, build_args):
    seconds = build("deploy/Dockerfile", SERVER_IMAGE, build_args)
    STEPS.record("build server image", seconds)
    return SERVER_IMAGE


@pytest.fixture(scope="session")
def builder_image(server_image, build_args):
    """The build stage of the same Dockerfile (all cached by now): the wheel build log."""
    tag = "tensorops-builder:test"
    build("deploy/Dockerfile", tag, build_args, "--target", "builder")
    yield tag
    docker("rmi", tag, check=False)


@pytest.fixture(scope="session")
def envoy_image(base_image, build_args):
    seconds = build("deploy/envoy.Dockerfile", ENVOY_IMAGE, build_args)
    STEPS.record("build balancer image", seconds)
    return ENVOY_IMAGE


def pytest_terminal_summary(terminalreporter):
    if STEPS.done:
        terminalreporter.section("deployment steps (wall clock)")
        for name, seconds in STEPS.done:
            terminalreporter.write_line(f"{seconds:8.1f} s  {name}")
    if STEPS.notes:
        terminalreporter.section("deployment figures")
        for text in STEPS.notes:
            terminalreporter.write_line(text)
