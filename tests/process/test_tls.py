"""HTTPS (issue 17, HTTP): a real node serving TLS with a certificate the test makes
(trustme: a throwaway CA and a server certificate for 127.0.0.1), and the project's
client talking to it with that CA, produce to consume. A client without the CA, or
speaking plain HTTP, gets nothing."""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import httpx
import pytest
import trustme

from ledgermq.client import Admin, BrokerUnavailableError, Consumer, Producer
from tests.process.dos_attacks import closed_by_peer
from tests.process.nodeproc import node_process
from tests.process.test_cli_client import ledgermq, one_error_line


def make_certificates(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(CA bundle, server certificate chain, server key), as PEM files."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_pem, cert_pem, key_pem = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    cert_pem.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key_pem))
    return ca_pem, cert_pem, key_pem


def test_the_client_produces_and_consumes_over_https(tmp_path: Path) -> None:
    ca, cert, key = make_certificates(tmp_path)
    tls = ("--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
    with node_process(tmp_path / "d", *tls, scheme="https", verify=str(ca)) as node:
        assert node.url.startswith("https://")
        with Admin(node.url, verify=str(ca)) as admin:
            admin.create_topic("secure", queues=1)
            assert admin.cluster().leader_url == node.url  # advertised as https
        with Producer(node.url, verify=str(ca)) as p:
            p.send("secure", [b"over", "tls"])
        with Consumer(node.url, group="g", topic="secure", verify=str(ca)) as c:
            got = c.poll(max_messages=10, wait_ms=2000)
        assert [m.body for m in got] == [b"over", b"tls"]
        with Producer(node.url, deadline_s=2) as p, pytest.raises(BrokerUnavailableError):
            p.send("secure", [b"no CA"])  # the system's CAs do not know this one
        plain = node.url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(plain + "/healthz", timeout=5)


def test_the_cli_over_https_trusts_a_private_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32: the documented backup, replace and upgrade procedures run the CLI
    against HTTPS nodes; it trusts a private CA from --ca-file or $SSL_CERT_FILE. The
    node here also takes at most 10 messages a request: a --batch over it is split."""
    ca, cert, key = make_certificates(tmp_path)
    tls = ("--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
    limit = ("--max-messages-per-request", "10")
    with node_process(tmp_path / "d", *tls, *limit, scheme="https", verify=str(ca)) as node:
        url = node.url
        out = ledgermq("topic", "create", "sec", "--queues", "2", "--brokers", url, ca_file=str(ca))
        assert "(created)" in out.stdout
        # Global options before the command, the CA from the environment.
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        p = ledgermq(
            "--brokers",
            url,
            "--json",
            "produce",
            "sec",
            "-",
            "--batch",
            "25",
            stdin="".join(f"m{i}\n" for i in range(25)),
        )
        monkeypatch.delenv("SSL_CERT_FILE")
        assert len(p.stdout.splitlines()) == 25
        assert "--batch 25 is over the broker's limits: batches of" in p.stderr
        listed = ledgermq("topic", "describe", "sec", "--brokers", url, ca_file=str(ca)).stdout
        assert listed.splitlines()[0] == "topic sec: 2 queues, 25 messages retained"
        err = one_error_line(ledgermq("topic", "list", "--brokers", url, "--deadline", "2", rc=1))
        assert "BROKER_UNAVAILABLE" in err and "CERTIFICATE_VERIFY_FAILED" in err
        err = one_error_line(
            ledgermq("topic", "list", "--brokers", url, rc=1, ca_file=str(tmp_path / "none"))
        )
        assert "--ca-file" in err and "no such file" in err


def test_a_client_that_never_completes_its_tls_handshake_is_closed(tmp_path: Path) -> None:
    """Issue 32: until its handshake is done a connection is the event loop's, not the
    protocol's (no read deadline sees it), and asyncio waits 60 s for it. The node closes
    it after --http-tls-handshake-timeout-s, and still serves the others."""
    ca, cert, key = make_certificates(tmp_path)
    tls = ("--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
    deadline = ("--http-tls-handshake-timeout-s", "1")
    with node_process(tmp_path / "d", *tls, *deadline, scheme="https", verify=str(ca)) as node:
        host, port = node.url.removeprefix("https://").split(":")
        silent = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3)]
        try:
            started = time.monotonic()
            assert all(closed_by_peer(s, timeout_s=10) for s in silent)
            assert time.monotonic() - started < 8  # the deadline, not asyncio's 60 s
        finally:
            for s in silent:
                s.close()
        trusted = ssl.create_default_context(cafile=str(ca))
        assert httpx.get(node.url + "/healthz", verify=trusted, timeout=5).status_code == 200
