"""The chaos checker's transaction rules (``tests/chaos/tx_checker.py``) on hand-made
histories: a clean one, with every fate a transaction has in a run, passes; each rule
broken is caught (and only it); and the fates are a function of the name."""

from __future__ import annotations

from pathlib import Path

from .checker import Verdict, check, summary
from .history import History, Op, Read, TxCheck, dump, load
from .tx_workload import FATES, check_answer, fate_of

NODES = ("n0", "n1", "n2")


class TxScript:
    """A history of transactions with a fake clock, 0.1 s per op."""

    def __init__(self) -> None:
        self.t = 0.0
        self.h = History(clock=self._tick, wall=lambda: 1_700_000_000.0 + self.t)
        self.values: dict[str, tuple[str, ...]] = {}

    def _tick(self) -> float:
        self.t = round(self.t + 0.1, 6)
        return self.t

    def begin(self, name: str, size: int, fate: str, outcome: str = "ok") -> str:
        values = tuple(f"{name}-{k}" for k in range(size))
        self.values[name] = values
        done = self.h.invoke("txproducer-0", "tx-begin",
                             {"name": name, "values": values, "fate": fate})  # fmt: skip
        tx_id = f"tx1:{len(self.values) * 10}"
        if outcome == "ok":
            done("ok", {"name": name, "id": tx_id})
        else:
            done(outcome, error="UNKNOWN_OUTCOME: no answer")
        return tx_id

    def end(self, name: str, tx_id: str, action: str, outcome: str = "ok",
            state: str | None = None, code: str | None = None,
            process: str = "txproducer-0") -> None:  # fmt: skip
        asked = {"name": name, "id": tx_id, "action": action}
        done = self.h.invoke(process, "tx-end", asked)
        if outcome == "ok":
            done("ok", {**asked, "state": state or ("committed" if action == "commit"
                                                    else "rolled_back")})  # fmt: skip
        elif state is not None:
            done(outcome, {**asked, "state": state}, error="TRANSACTION_RESOLVED: other way")
        else:
            done(outcome, error=f"{code or 'UNKNOWN_OUTCOME'}: said the broker")

    def checks(self, *checks: tuple[str, str, tuple[str, ...] | None]) -> None:
        """(name, id, values: None for the transaction's own) each."""
        got = tuple(TxCheck(i, v if v is not None else self.values[n], 1) for n, i, v in checks)
        self.h.invoke("txchecker-0", "tx-checks", None)("ok", got)

    def pull(self, reads: list[tuple[str, int, int]], node: str = "n1") -> None:
        done = self.h.invoke("txpuller-0", "tx-pull", (0, 0))
        done("ok", tuple(Read(*r) for r in reads), node)

    def drain(self, names: list[str], nodes: tuple[str, ...] = NODES,
              extra: list[str] = ()) -> None:  # type: ignore[assignment]  # fmt: skip
        """Every node holds the values of ``names`` (and ``extra``), in that order, in
        queue 0; no transaction pending."""
        values = [x for n in names for x in self.values[n]] + list(extra)
        for node in nodes:
            self.h.ok("drain", "tx-drain", tuple(Read(x, 0, o) for o, x in enumerate(values)), node)
        for node in nodes:
            self.h.ok("tx-pending", "tx-pending", (), node)

    def ops(self) -> list[Op]:
        return list(self.h)


def _clean() -> TxScript:
    """Every fate a transaction has in a run, by the rules."""
    s = TxScript()
    a = s.begin("x0-0", 2, "commit")
    s.end("x0-0", a, "commit")
    b = s.begin("x0-1", 1, "rollback")
    s.end("x0-1", b, "rollback")
    c = s.begin("x0-2", 3, "check-commit")
    d = s.begin("x0-3", 1, "check-rollback")
    e = s.begin("x0-4", 1, "check-none")
    s.begin("x0-5", 2, "commit", outcome="info")  # stored after all: the checks find it
    f = s.begin("x0-6", 1, "commit")
    s.end("x0-6", f, "commit", outcome="info")  # its commit lost: a check commits it
    s.checks(("x0-2", c, None), ("x0-3", d, None), ("x0-4", e, None))
    s.checks(("x0-5", "tx1:55", None), ("x0-6", f, None))
    s.end("x0-2", c, "commit", process="txchecker-0")
    s.end("x0-3", d, "rollback", process="txchecker-0")
    s.end("x0-5", "tx1:55", "commit", process="txchecker-0")
    s.end("x0-6", f, "commit", process="txchecker-0")
    s.begin("x0-7", 1, "rollback", outcome="fail")
    s.pull([("x0-0-0", 0, 0), ("x0-0-1", 0, 1)])  # read after its commit was asked
    s.drain(["x0-0", "x0-2", "x0-5", "x0-6"])
    return s


def _anomalies(v: Verdict) -> set[str]:
    return set(v.anomalies())


def test_a_clean_transaction_history_is_valid() -> None:
    v = check(_clean().ops())
    assert v.valid, v.anomalies()
    assert (v.tx_begun, v.tx_committed, v.tx_absent, v.tx_checks) == (8, 4, 4, 5)
    assert v.tx_outcomes == {"ok": 6, "info": 1, "fail": 1}
    assert v.tx_ends["checker commit ok"] == 3 and v.tx_ends["producer commit info"] == 1
    assert "transactions" in summary(v) and "transaction ends" in summary(v)


def test_a_transaction_history_survives_dump_and_load(tmp_path: Path) -> None:
    ops = _clean().ops()
    dump(ops, tmp_path / "h.jsonl")
    assert load(tmp_path / "h.jsonl") == ops


def test_a_commit_answered_ok_whose_messages_are_missing_is_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 2, "commit")
    s.end("x0-0", a, "commit")
    s.drain([])
    v = check(s.ops())
    assert _anomalies(v) == {"tx_lost"}, v.anomalies()
    assert len(v.tx_lost) == 3  # (on every node)


def test_a_rollback_refused_as_committed_counts_as_a_commit() -> None:
    s = TxScript()
    a = s.begin("x0-0", 1, "commit")
    s.end("x0-0", a, "commit", outcome="info")
    s.end("x0-0", a, "rollback", outcome="fail", state="committed", process="txchecker-0")
    s.drain([])
    assert _anomalies(check(s.ops())) == {"tx_lost"}


def test_part_of_a_transaction_delivered_is_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 3, "commit")
    s.end("x0-0", a, "commit", outcome="info")  # (may have committed)
    s.values["part"] = s.values["x0-0"][:2]
    s.drain(["part"])
    v = check(s.ops())
    assert _anomalies(v) == {"tx_partial"}, v.anomalies()


def test_a_rolled_back_transaction_delivered_is_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 1, "rollback")
    s.end("x0-0", a, "commit", outcome="info")  # asked to commit, and rolled back
    s.end("x0-0", a, "rollback", process="txchecker-0")
    s.drain(["x0-0"])
    v = check(s.ops())
    assert _anomalies(v) == {"tx_visible"} and "answered rolled back" in v.tx_visible[0]


def test_a_transaction_never_asked_to_commit_delivered_is_caught() -> None:
    s = TxScript()
    s.begin("x0-0", 1, "check-none")
    s.drain(["x0-0"])
    v = check(s.ops())
    assert _anomalies(v) == {"tx_visible"} and "never asked to commit" in v.tx_visible[0]


def test_a_half_message_read_before_its_commit_was_asked_is_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 1, "commit")
    s.pull([("x0-0-0", 0, 0)])
    s.end("x0-0", a, "commit")
    s.drain(["x0-0"])
    v = check(s.ops())
    assert _anomalies(v) == {"tx_visible"}, v.anomalies()
    assert "before any commit of it was asked" in v.tx_visible[0]


def test_a_transaction_message_in_the_workload_topic_or_a_phantom_is_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 1, "commit")
    s.end("x0-0", a, "commit")
    s.h.invoke("consumer-0", "poll", None)("ok", (Read("x0-0-0", 0, 0),), "n0")
    s.drain(["x0-0"], extra=["ghost"])
    v = check(s.ops())
    assert _anomalies(v) == {"tx_visible", "unexpected"}, v.anomalies()
    assert any("workload's topic" in x for x in v.tx_visible)
    assert any("no transaction carried it" in x for x in v.tx_visible)


def test_a_transaction_message_delivered_twice_is_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 2, "commit")
    s.end("x0-0", a, "commit")
    s.drain(["x0-0"], extra=["x0-0-1"])
    v = check(s.ops())
    assert _anomalies(v) == {"tx_duplicated"}, v.anomalies()


def test_contradicting_answers_are_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 1, "commit")
    s.end("x0-0", a, "commit")
    s.end("x0-0", a, "rollback", process="txchecker-0")
    s.drain([])
    assert "tx_answers" in _anomalies(check(s.ops()))


def test_an_acknowledged_transaction_not_found_is_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 1, "rollback")
    s.end("x0-0", a, "rollback", outcome="fail", code="TRANSACTION_NOT_FOUND")
    s.drain([])
    v = check(s.ops())
    assert _anomalies(v) == {"tx_answers"} and "TRANSACTION_NOT_FOUND" in v.tx_answers[0]


def test_a_check_showing_other_messages_or_another_id_is_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 2, "check-rollback")
    b = s.begin("x0-1", 1, "check-rollback")
    s.checks(("x0-0", a, ("x0-0-0",)), ("x0-1", "tx1:999", None))
    s.drain([])
    v = check(s.ops())
    assert _anomalies(v) == {"tx_answers"} and len(v.tx_answers) == 2, v.tx_answers
    assert b in v.tx_answers[1]


def test_a_transaction_pending_at_the_end_is_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 1, "check-none")
    for node in NODES:
        s.h.ok("drain", "tx-drain", (), node)
        s.h.ok("tx-pending", "tx-pending", (a,), node)
    v = check(s.ops())
    assert _anomalies(v) == {"tx_unresolved"} and len(v.tx_unresolved) == 3


def test_a_drained_node_that_does_not_say_what_is_pending_is_caught() -> None:
    s = TxScript()
    s.begin("x0-0", 1, "check-none")
    s.h.ok("drain", "tx-drain", (), "n0")
    assert _anomalies(check(s.ops())) == {"tx_unresolved"}


def test_replicas_that_differ_are_caught() -> None:
    s = TxScript()
    a = s.begin("x0-0", 2, "commit")
    s.end("x0-0", a, "commit")
    s.drain(["x0-0"], nodes=("n0", "n1"))
    swapped = (Read("x0-0-1", 0, 0), Read("x0-0-0", 0, 1))
    s.h.ok("drain", "tx-drain", swapped, "n2")
    s.h.ok("tx-pending", "tx-pending", (), "n2")
    v = check(s.ops())
    assert _anomalies(v) == {"tx_replicas"}, v.anomalies()
    assert "n2 and n0: 2 places differ" in v.tx_replicas[0]


def test_the_fate_of_a_transaction_is_its_name_s_and_the_checks_answer_it() -> None:
    names = [f"x0-{n}" for n in range(1000)]
    fates = [fate_of(n) for n in names]
    assert fates == [fate_of(n) for n in names]  # the same in every process and run
    assert set(fates) == set(FATES)
    assert {f: check_answer(f) for f in FATES} == {
        "commit": "commit",
        "rollback": "rollback",
        "check-commit": "commit",
        "check-rollback": "rollback",
        "check-none": None,
    }
