"""Flags, TENSOROPS_* variables and defaults."""
from __future__ import annotations

import io
import json
import logging
import socket
import subprocess
import sys

import pytest

from tensorops_server import config, logs
from tensorops.protocol.wire import DEFAULT_MAX_MESSAGE_BYTES


def test_defaults_suit_localhost():
    c = config.load([], environ={})
    assert (c.host, c.port, c.metrics_port) == ("127.0.0.1", 50051, 9100)
    assert c.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES  # the client's default too
    assert c.workers >= 1 and c.log_level == "info" and c.session_ttl > 0


def test_environment_then_flags():
    env = {"TENSOROPS_PORT": "6000", "TENSOROPS_WORKERS": "3", "TENSOROPS_MAX_SESSIONS": "7",
           "TENSOROPS_SESSION_TTL": "1.5", "TENSOROPS_LOG_LEVEL": "DEBUG", "TENSOROPS_METRICS_PORT": "-1"}
    c = config.load([], environ=env)
    assert (c.port, c.workers, c.max_sessions, c.session_ttl, c.log_level, c.metrics_port) == \
        (6000, 3, 7, 1.5, "debug", -1)
    c = config.load(["--port", "7000", "--workers", "5"], environ=env)
    assert (c.port, c.workers, c.max_sessions) == (7000, 5, 7)


def test_every_flag_has_a_variable():
    help_text = config.parser().format_help()
    for f in config.fields(config.Config):
        assert "--" + f.name.replace("_", "-") in help_text
        assert config.env_name(f.name) in help_text


@pytest.mark.parametrize("argv,env,needle", [
    (["--port", "70000"], {}, "--port"),
    (["--workers", "0"], {}, "--workers"),
    (["--log-level", "loud"], {}, "--log-level"),
    ([], {"TENSOROPS_MAX_MESSAGE_BYTES": "lots"}, "TENSOROPS_MAX_MESSAGE_BYTES"),
    ([], {"TENSOROPS_SESSION_TTL": "-3"}, "TENSOROPS_SESSION_TTL"),
])
def test_bad_values_exit_2_naming_the_setting(argv, env, needle, capsys):
    with pytest.raises(SystemExit) as exit_info:
        config.load(argv, environ=env)
    assert exit_info.value.code == 2
    assert needle in capsys.readouterr().err


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "tensorops_server", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "TENSOROPS_" in out and "--metrics-port" in out


def test_deployment_settings():
    from tensorops_server.server import connection_age_options

    c = config.load([], environ={})
    assert (c.drain_delay, c.max_connection_age, c.max_connection_age_grace, c.instance_name) == (2.0, 300.0, 30.0, "")
    assert connection_age_options(c) == [("grpc.max_connection_idle_ms", 60_000),
                                         ("grpc.max_connection_age_ms", 300_000),
                                         ("grpc.max_connection_age_grace_ms", 30_000)]
    c = config.load(["--max-connection-age", "0.5", "--instance-name", "r1", "--max-connection-idle", "0"],
                    environ={"TENSOROPS_MAX_CONNECTION_AGE_GRACE": "0", "TENSOROPS_DRAIN_DELAY": "0"})
    assert (c.drain_delay, c.instance_name) == (0.0, "r1")
    assert connection_age_options(c) == [("grpc.max_connection_age_ms", 500)]  # grace 0: no limit
    assert connection_age_options(config.load(["--max-connection-age", "0", "--max-connection-idle", "0"],
                                              environ={})) == []  # never
    with pytest.raises(SystemExit):
        config.load(["--drain-delay", "-1"], environ={})


def test_boolean_flags_take_the_bare_form():
    c = config.load(["--allow-shared-memory", "--reflection", "--port", "5"], environ={})
    assert (c.allow_shared_memory, c.reflection, c.port) == (True, True, 5)
    c = config.load(["--allow-shared-memory", "false", "--reflection", "off"], environ={})
    assert (c.allow_shared_memory, c.reflection) == (False, False)
    assert config.load(["--port", "5", "--allow-shared-memory"], environ={}).allow_shared_memory is True


def test_new_caps_and_the_metrics_address_default_to_safe_values():
    c = config.load([], environ={})
    assert c.metrics_host == "127.0.0.1"  # not where the gRPC port listens: scrapers elsewhere are opted in
    assert (c.max_connections, c.handshake_timeout, c.max_health_watches) == (2048, 5.0, 256)


def server_cli(*argv, timeout=30):
    return subprocess.run([sys.executable, "-m", "tensorops_server", *argv], capture_output=True, text=True,
                          timeout=timeout)


def test_version():
    done = server_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"tensorops-server {config.version()}" and config.version()[0].isdigit()


@pytest.mark.parametrize("argv,message", [
    (["--port", "abc"], "argument --port: expected an integer (a port number 0-65535), got 'abc'"),
    (["--port", "-1"], "argument --port: expected an integer (a port number 0-65535), got '-1'"),
    (["--metrics-port", "x"], "argument --metrics-port: expected an integer (a port number 0-65535, or -1), got 'x'"),
    (["--workers", "many"], "argument --workers: expected an integer > 0, got 'many'"),
    (["--grace", "soon"], "argument --grace: expected a number >= 0, got 'soon'"),
    (["--reflection", "maybe"], "argument --reflection: expected true or false, got 'maybe'"),
])
def test_bad_values_are_explained(argv, message):
    done = server_cli(*argv)
    assert done.returncode == 2
    assert message in done.stderr and "invalid" not in done.stderr


def test_a_port_in_use_is_named_in_a_json_line_and_grpc_lines_are_json_too():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = server_cli("--port", str(port), "--metrics-port", "-1")
    assert done.returncode == 1
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]  # every line is JSON
    failure = next(line for line in lines if line["event"] == "cannot start")
    assert failure["level"] == "error"
    assert failure["error"] == f"cannot listen on 127.0.0.1:{port}: address already in use"
    # gRPC core's own line about it, which it writes to the descriptor itself, came through the logger
    from_grpc = [line for line in lines if line["logger"] == "tensorops_server.grpc"]
    assert from_grpc and "Address already in use" in from_grpc[0]["event"] and from_grpc[0]["level"] == "error"
    assert from_grpc[0]["source"].startswith("add_port")


def test_metrics_port_in_use_is_named_too():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = server_cli("--port", "0", "--metrics-port", str(taken.getsockname()[1]))
    assert done.returncode == 1
    failure = next(json.loads(line) for line in done.stderr.splitlines() if "cannot start" in line)
    assert "address already in use" in failure["error"].lower() and "metrics" in failure["error"]


def test_stderr_lines_of_any_origin_become_json_records():
    out = io.StringIO()
    logger = logs.setup("warning", "json", stream=out)
    for line in ("W1127 23:17:20.914609   13286 chttp2_server.cc:12] Handshake failed",
                 "Traceback (most recent call last):",
                 "I1127 23:17:20.914609   13286 ev_epoll1.cc:1] below the level: dropped",
                 "   "):
        logs.log_stderr_line(logger, line)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert records == [
        {**records[0], "level": "warning", "logger": "tensorops_server.grpc", "event": "Handshake failed",
         "source": "chttp2_server.cc:12"},
        {**records[1], "level": "warning", "logger": "tensorops_server.stderr",
         "event": "Traceback (most recent call last):"}]
    logging.getLogger(logs.LOGGER).handlers.clear()


def test_health_cli_explains_a_bad_timeout(capsys):
    from tensorops_server import health_cli

    with pytest.raises(SystemExit) as exit_info:
        health_cli.main(["--timeout", "soon"], environ={})
    assert exit_info.value.code == health_cli.USAGE
    assert "argument --timeout: expected a number of seconds > 0, got 'soon'" in capsys.readouterr().err
