"""Fixtures of the deployment tests. The container tests need a Docker engine: `make
test-deploy` starts a private one and sets TENSOROPS_DEPLOY_TESTS=1, under which a missing
engine or tool is a failure, never a skip. Elsewhere (a plain `pytest tests`) they are
skipped with that reason."""

from __future__ import annotations

import os

import pytest

from dockertools import (
    BASE_IMAGE,
    DEPLOY,
    ENVOY_IMAGE,
    SERVER_IMAGE,
    STEPS,
    docker,
    documented,
    engine_problem,
    extra_ca_pem,
    require,
    run,
)


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


@pytest.fixture(scope="session")
def server_image(base_image, build_args):
    """Built with the README's command (plus the extra CA of this machine, if any)."""
    with STEPS.timed("build server image"):
        run(*documented("build", context=[*build_args, "."]), timeout=1500)
    return SERVER_IMAGE


@pytest.fixture(scope="session")
def builder_image(server_image, build_args):
    """The build stage of the same Dockerfile (all cached by now): the wheel build log."""
    tag = "tensorops-builder:test"
    docker("build", "-f", "deploy/Dockerfile", "-t", tag, "--target", "builder", *build_args, ".", timeout=1500)
    yield tag
    # the tag only: its layers are the build cache of the next run (a plain rmi prunes them)
    docker("rmi", "--no-prune", tag, check=False)


@pytest.fixture(scope="session")
def envoy_image(base_image, build_args):
    with STEPS.timed("build balancer image"):
        run(*documented("build-balancer", context=[*build_args, "."]), timeout=1500)
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
