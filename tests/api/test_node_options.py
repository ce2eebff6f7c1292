"""The node's limit, garbage-collector and exposure options of ``ledgermq broker``
(issue 17, HTTP), parsed without starting a node: every limit is an option with its
default, the thresholds' forms, and the warning for an HTTP port open to the network
without tokens. The same options on a real node process are in
``tests/process/test_node_limits.py``."""

from __future__ import annotations

import argparse

import pytest

from broker.settings import BrokerSettings, Limits
from consumequeue import ConsumeQueueSettings
from ledgermq.node import (
    GC_THRESHOLDS,
    LIMIT_OPTIONS,
    HttpSettings,
    add_broker_options,
    exposure_warnings,
    settings_from_args,
)


def test_the_garbage_collector_thresholds_are_a_setting() -> None:
    p = argparse.ArgumentParser()
    add_broker_options(p)
    assert settings_from_args(p.parse_args([]))[1].gc_thresholds == GC_THRESHOLDS
    parsed = settings_from_args(p.parse_args(["--gc-thresholds", "5000,7,9"]))[1]
    assert parsed.gc_thresholds == (5000, 7, 9)
    assert settings_from_args(p.parse_args(["--gc-thresholds", "python"]))[1].gc_thresholds is None
    for bad in ("1,2", "a,b,c", "0,1,1", "1,2,3,4"):
        with pytest.raises(SystemExit):
            p.parse_args(["--gc-thresholds", bad])
    assert HttpSettings().gc_thresholds is None  # a node inside another program: untouched


def test_an_open_port_without_tokens_is_warned_about() -> None:
    """Tests bind 127.0.0.1 only: the check itself, for the addresses a node may bind."""
    for host in ("0.0.0.0", "::", "10.1.2.3", "broker.example"):
        (warning,) = exposure_warnings(HttpSettings(host=host))
        assert "without --auth-token" in warning and host in warning
        assert exposure_warnings(HttpSettings(host=host, auth_token="t")) == []
    for host in ("127.0.0.1", "::1", "localhost"):
        assert exposure_warnings(HttpSettings(host=host)) == []
    assert len(exposure_warnings(HttpSettings(auth_token="t", auth_token_in_argv=True))) == 1


def test_every_limit_is_an_option_with_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEDGERMQ_AUTH_TOKEN", raising=False)
    parser = argparse.ArgumentParser()
    add_broker_options(parser)
    settings, http = settings_from_args(parser.parse_args([]))
    assert settings.limits == Limits() and http.max_connections == 2048
    assert http.metrics_need_auth is None and not http.auth_token_in_argv
    args = ["--max-topics", "7", "--max-total-queues", "70", "--max-long-polls", "9"]
    args += ["--max-http-connections", "11", "--no-metrics-auth", "--auth-token", "t"]
    settings, http = settings_from_args(parser.parse_args(args))
    assert (settings.limits.max_topics, settings.limits.max_total_queues) == (7, 70)
    assert settings.limits.max_long_polls == 9 and http.max_connections == 11
    assert http.metrics_need_auth is False and http.auth_token_in_argv
    for name in LIMIT_OPTIONS:
        assert parser.get_default(name) == getattr(Limits(), name), name


def test_the_consume_queues_bounds_are_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: how many queues keep their files mapped, how far ahead of its writes a
    queue allocates disk blocks."""
    for name in ("MAX_OPEN_QUEUES", "QUEUE_RESERVE_UNITS", "DISPATCH_CHECKPOINT_INTERVAL_MS"):
        monkeypatch.delenv(f"LEDGERMQ_{name}", raising=False)
    parser = argparse.ArgumentParser()
    add_broker_options(parser)
    settings, _ = settings_from_args(parser.parse_args([]))
    assert settings.consume_queue == ConsumeQueueSettings()
    assert settings.dispatch_checkpoint_interval_ms == 1000
    args = ["--max-open-queues", "16", "--queue-reserve-units", "2048"]
    args += ["--dispatch-checkpoint-interval-ms", "5000"]
    parsed = settings_from_args(parser.parse_args(args))[0]
    cq = parsed.consume_queue
    assert (cq.max_open_queues, cq.max_reserve_units) == (16, 2048)
    assert parsed.dispatch_checkpoint_interval_ms == 5000
    with pytest.raises(ValueError, match="max_open_queues"):
        settings_from_args(parser.parse_args(["--max-open-queues", "0"]))


def test_the_transaction_check_schedule_is_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FIRST_CHECK_MS", "CHECK_INTERVAL_MS", "MAX_CHECKS"):
        monkeypatch.delenv(f"LEDGERMQ_TX_{name}", raising=False)
    parser = argparse.ArgumentParser()
    add_broker_options(parser)
    settings, _ = settings_from_args(parser.parse_args([]))
    default = BrokerSettings()
    assert (settings.tx_first_check_ms, settings.tx_check_interval_ms, settings.tx_max_checks) == (
        default.tx_first_check_ms,
        default.tx_check_interval_ms,
        default.tx_max_checks,
    )
    args = ["--tx-first-check-ms", "300", "--tx-check-interval-ms", "400", "--tx-max-checks", "5"]
    settings, _ = settings_from_args(parser.parse_args(args))
    assert (settings.tx_first_check_ms, settings.tx_check_interval_ms, settings.tx_max_checks) == (
        300,
        400,
        5,
    )
    with pytest.raises(ValueError, match="tx_max_checks"):
        settings_from_args(parser.parse_args(["--tx-max-checks", "-1"]))


def test_the_role_history_size_is_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """GET /v1/cluster/history keeps this many role changes (the console's master history)."""
    monkeypatch.delenv("LEDGERMQ_ROLE_HISTORY_SIZE", raising=False)
    parser = argparse.ArgumentParser()
    add_broker_options(parser)
    assert settings_from_args(parser.parse_args([]))[0].role_history_size == 200
    parsed = settings_from_args(parser.parse_args(["--role-history-size", "7"]))[0]
    assert parsed.role_history_size == 7
    with pytest.raises(ValueError, match="role_history_size"):
        settings_from_args(parser.parse_args(["--role-history-size", "0"]))
