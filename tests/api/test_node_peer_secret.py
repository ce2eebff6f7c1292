"""``ledgermq broker --peer-secret`` / ``--peer-secret-file`` / ``LEDGERMQ_PEER_SECRET``
(docs/operations.md) reach the node's Raft transport; an empty secret is a clear error."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ledgermq.node import add_broker_options, settings_from_args

ENV = ("LEDGERMQ_PEER_SECRET", "LEDGERMQ_PEER_SECRET_FILE")


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_broker_options(p)  # reads LEDGERMQ_* now, as the real command line does
    return p.parse_args(argv)


@pytest.fixture(autouse=True)
def _no_secret_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def test_no_secret_by_default() -> None:
    settings, _ = settings_from_args(_parse([]))
    assert settings.transport.peer_secret is None


def test_the_secret_from_a_file_loses_its_trailing_newline(tmp_path: Path) -> None:
    f = tmp_path / "peer-secret"
    f.write_bytes(b"s3cret-from-file\n")
    settings, _ = settings_from_args(_parse(["--peer-secret-file", str(f)]))
    assert settings.transport.peer_secret == b"s3cret-from-file"
    assert "s3cret" not in repr(settings)  # never printed with the settings


def test_the_secret_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGERMQ_PEER_SECRET", "s3cret-from-env")
    settings, _ = settings_from_args(_parse([]))
    assert settings.transport.peer_secret == b"s3cret-from-env"
    monkeypatch.delenv("LEDGERMQ_PEER_SECRET")
    f = tmp_path / "peer-secret"
    f.write_text("s3cret-from-env-file\n")
    monkeypatch.setenv("LEDGERMQ_PEER_SECRET_FILE", str(f))
    settings, _ = settings_from_args(_parse([]))
    assert settings.transport.peer_secret == b"s3cret-from-env-file"


def test_an_empty_or_double_secret_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        settings_from_args(_parse(["--peer-secret-file", str(empty)]))
    with pytest.raises(ValueError, match="empty"):
        settings_from_args(_parse(["--peer-secret", ""]))
    with pytest.raises(ValueError, match="not both"):
        settings_from_args(_parse(["--peer-secret", "a", "--peer-secret-file", str(empty)]))
    monkeypatch.setenv("LEDGERMQ_PEER_SECRET", "")
    with pytest.raises(ValueError, match="empty"):
        settings_from_args(_parse([]))
