"""Small pieces every ``ledgermq`` command shares: options that also come from
``LEDGERMQ_<NAME>`` environment variables (docs/operations.md), and one-line errors."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

ENV_PREFIX = "LEDGERMQ_"
DEFAULT_BROKERS = "http://127.0.0.1:8080"


def env_name(option: str) -> str:
    """``--peer-urls`` → ``LEDGERMQ_PEER_URLS``."""
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").upper()


def add_option(parser: argparse.ArgumentParser, option: str, *aliases: str, **kwargs: Any) -> None:
    """``parser.add_argument(option, *aliases, ...)`` whose default comes from
    ``LEDGERMQ_<NAME>`` (named after ``option``) when that variable is set (the command
    line still wins; a required option set by the environment is no longer required).
    Boolean flags take ``1/true/yes/on`` and ``0/false/no/off``."""
    env = env_name(option)
    raw = os.environ.get(env)
    action = kwargs.get("action")
    if raw is not None:
        if action in ("store_true", "store_false", argparse.BooleanOptionalAction):
            kwargs["default"] = parse_bool(raw, env)
        elif action == "append":  # a comma-separated list
            conv = kwargs.get("type", str)
            try:
                kwargs["default"] = [conv(x.strip()) for x in raw.split(",") if x.strip()]
            except (TypeError, ValueError) as e:
                fail(f"{env}={raw!r}: {e}")
        else:
            conv = kwargs.get("type", str)
            try:
                kwargs["default"] = conv(raw)
            except (TypeError, ValueError) as e:
                fail(f"{env}={raw!r}: {e}")
            choices = kwargs.get("choices")
            if choices is not None and kwargs["default"] not in choices:
                fail(f"{env}={raw!r}: want one of {', '.join(map(str, choices))}")
        kwargs["required"] = False
    help_text = kwargs.get("help") or ""
    kwargs["help"] = f"{help_text} [env {env}]".strip()
    parser.add_argument(option, *aliases, **kwargs)


def add_brokers_option(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser,
        "--brokers",
        default=DEFAULT_BROKERS,
        help="broker URLs, comma-separated; any of them, the master is found",
    )


# The options every client command takes (``client._common``): given before the
# command (``ledgermq --brokers URL topic list``) they are moved after it. True: the
# option takes a value.
CLIENT_OPTIONS = {
    "--brokers": True,
    "--auth-token": True,
    "--timeout": True,
    "--deadline": True,
    "--ca-file": True,
    "--json": False,
}


def hoist_client_options(argv: list[str]) -> list[str]:
    """``argv`` with the ``CLIENT_OPTIONS`` that come before the command moved to the
    end (before a ``--``, if any), where the command's parser reads them."""
    front: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        name, eq, _ = argv[i].partition("=")
        takes_value = CLIENT_OPTIONS.get(name)
        if takes_value is None:  # --help, --version, or not ours: argparse answers
            break
        n = 2 if takes_value and not eq else 1
        front += argv[i : i + n]
        i += n
    if not front:
        return argv
    rest = argv[i:]
    end = rest.index("--") if "--" in rest else len(rest)
    return rest[:end] + front + rest[end:]


def parse_bool(raw: str, what: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    fail(f"{what}={raw!r}: want true or false")


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one clear line (no traceback) and exit."""
    print(f"ledgermq: {message}", file=sys.stderr)
    raise SystemExit(code)
