"""What the official clients' scenarios share, Python's and Node's alike: the
transactions of the server-check scenario and the FIFO push scenario's messages and
order check."""

from __future__ import annotations

from typing import Any

# One transaction each: committed and rolled back by the client, and two left open for
# the server's check, which the producer's checker answers as CHECKER says.
TRANSACTIONS = [
    {"body": "committed", "end": "commit"},
    {"body": "rolled back", "end": "rollback"},
    {"body": "checked: commit", "end": "open"},
    {"body": "checked: roll back", "end": "open"},
]
CHECKER = {"checked: commit": "commit", "checked: roll back": "rollback"}
FIFO_GROUPS = ("g1", "g2", "g3")
FIFO_STEPS = 5
FIFO_FAIL = "g2 step 1"  # failed once: retried in place, before g2's next message


def fifo_messages(topic: str) -> list[dict[str, Any]]:
    """Five steps of each message group, interleaved."""
    return [
        {"topic": topic, "body": f"{g} step {i}", "group": g}
        for i in range(FIFO_STEPS)
        for g in FIFO_GROUPS
    ]


def assert_fifo_order(deliveries: list[dict[str, Any]]) -> None:
    """Every group's steps consumed in order, and ``FIFO_FAIL`` delivered again at once
    (its group's next message waited for it)."""
    done: dict[str, list[str]] = {g: [] for g in FIFO_GROUPS}
    for d in deliveries:
        assert d["message_group"] in done, d
        if d["result"] == "success":
            done[d["message_group"]].append(d["body"])
    for g in FIFO_GROUPS:
        assert done[g] == [f"{g} step {i}" for i in range(FIFO_STEPS)], done
    seen = [d["body"] for d in deliveries if d["message_group"] == "g2"]
    assert seen[:3] == ["g2 step 0", FIFO_FAIL, FIFO_FAIL], seen
