"""`make test-deploy` is never skipped silently: without an engine the container tests fail
with the reason, and the engine script refuses to run, saying why, when it cannot start the
engine. Outside `make test-deploy` the same tests are skipped with the reason."""

from __future__ import annotations

import os
import subprocess
import sys

from dockertools import DEPLOY, ROOT

ENGINE_SCRIPT = DEPLOY / "scripts" / "docker-engine.sh"


def pytest_without_engine(tmp_path, required: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    env.pop("TENSOROPS_DEPLOY_TESTS", None)
    if required:
        env["TENSOROPS_DEPLOY_TESTS"] = "1"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rfEs",
            "-p",
            "no:cacheprovider",
            "tests/deploy/test_containers.py::test_image_size",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_container_tests_fail_without_an_engine_under_make_test_deploy(tmp_path):
    r = pytest_without_engine(tmp_path, required=True)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert "container tests need a Docker engine" in out and "no-engine.sock" in out, out


def test_container_tests_skip_with_the_reason_elsewhere(tmp_path):
    r = pytest_without_engine(tmp_path, required=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "1 skipped" in out and "container tests need a Docker engine" in out, out


def test_engine_script_fails_with_the_reason_without_root(tmp_path):
    """dockerd needs root: as another user the script says so and fails, and touches
    nothing of an engine that may be running (its own socket and state are elsewhere).
    The script reaches that user's shell on its standard input, opened here: the checkout
    may lie in a directory only its owner can enter (a home directory, `mktemp -d`)."""
    env = dict(
        os.environ, TENSOROPS_DOCKER_SOCK=str(tmp_path / "engine.sock"), TENSOROPS_DOCKER_ROOT=str(tmp_path / "root")
    )
    with ENGINE_SCRIPT.open("rb") as script:
        r = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-s", "run", "true"],
            stdin=script,
            cwd="/",
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 1, r.stderr
    assert "ERROR: the engine needs root (dockerd), running as uid 65534" in r.stderr, r.stderr
    assert not (tmp_path / "root").exists()


def test_engine_script_usage():
    r = subprocess.run([str(ENGINE_SCRIPT), "restart"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage:" in r.stderr
