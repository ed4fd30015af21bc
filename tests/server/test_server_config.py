"""Flags, TENSOROPS_* variables and defaults."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tensorops_server import config
from tensorops._wire import DEFAULT_MAX_MESSAGE_BYTES


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
    assert connection_age_options(c) == [("grpc.max_connection_age_ms", 300_000),
                                         ("grpc.max_connection_age_grace_ms", 30_000)]
    c = config.load(["--max-connection-age", "0.5", "--instance-name", "r1"],
                    environ={"TENSOROPS_MAX_CONNECTION_AGE_GRACE": "0", "TENSOROPS_DRAIN_DELAY": "0"})
    assert (c.drain_delay, c.instance_name) == (0.0, "r1")
    assert connection_age_options(c) == [("grpc.max_connection_age_ms", 500)]  # grace 0: no limit
    assert connection_age_options(config.load(["--max-connection-age", "0"], environ={})) == []  # never
    with pytest.raises(SystemExit):
        config.load(["--drain-delay", "-1"], environ={})
