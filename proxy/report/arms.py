"""The holdout's arms: which conversations ctxbudget leaves untouched, kept where every worker
and instance finds them (the report's database, table `arms`).

`contextBudget.holdout` (0-0.5) is the share of conversations that go upstream exactly as
with the budget off, so the report can compare what the two arms cost per request on the
provider's own bill (`docs/holdout.md`). A conversation's arm is drawn once, when it is first
seen: a deterministic function of its owner and its id (`draw`), written with "first writer
wins" and read back, so two workers or two instances that meet a new conversation at once
agree, and a later change of the share never moves a conversation already drawn.

Each process keeps the arms it read or drew (`Arms`: per owner, the newest
`PER_OWNER` conversations of at most `OWNERS` owners), so a conversation costs one database
round trip per process, on its first request there. While the database does not answer, the
draw alone decides (it is what the database would have kept unless the share changed since),
and is not kept: the next request asks again.

The writer thread adds each request's sums to its conversation's row (`add_requests`), and the
report reads them back per conversation (`conversations`): the estimator
(`proxy/report/holdout.py`) clusters by conversation, so the rows are all it needs.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

from cachetools import LRUCache

from ctxbudget.memory.pg import DatabaseUnavailable, PgDatabase
from ctxbudget.memory.sqlite import Database
from ctxbudget.proxy.report.ledger import loaded, stored

log = logging.getLogger("ctxbudget.holdout")

Arm = Literal["budget", "holdout"]
ARMS: tuple[Arm, ...] = ("budget", "holdout")
PER_OWNER = 4096
"""Conversations whose arm each process keeps per owner, at most."""
OWNERS = 1024
"""Owners whose arms each process keeps, at most (the least recent gives way)."""
ARM_SUMS = (
    "requests", "billed", "priced", "input", "cache_read", "cache_write", "output",
    "cost_usd", "without_usd", "turns", "upstream_errors",
)  # fmt: skip
"""Per-conversation sums, request by request."""
ARM_PEAKS = ("tool_calls", "reruns")
"""Per-conversation peaks: each request's history holds the conversation's so far."""

SCHEMA_9 = """
CREATE TABLE IF NOT EXISTS arms (owner TEXT NOT NULL, conversation TEXT NOT NULL,
    arm TEXT NOT NULL, drawn {real} NOT NULL, chosen {int} NOT NULL DEFAULT 0,
    last {real} NOT NULL DEFAULT 0, {sums}, {peaks},
    acted_turn {int} NOT NULL DEFAULT -1,
    PRIMARY KEY (owner, conversation));
CREATE INDEX IF NOT EXISTS arms_drawn ON arms (owner, drawn)
"""
"""9: the holdout's arms (`contextBudget.holdout`) and each conversation's sums: what it cost,
its turns, tool calls, reruns after a clamp or prune, upstream errors, and the turn of its last
clamp or prune (`acted_turn`, -1: none); `chosen` when a request of it chose the budget
itself (`x-context-budget: on|off`): out of the comparison."""


def schema_9(real: str, integer: str) -> str:
    return SCHEMA_9.format(
        real=real,
        int=integer,
        sums=", ".join(
            f"{c} {real if c.endswith('usd') else integer} NOT NULL DEFAULT 0" for c in ARM_SUMS
        ),
        peaks=", ".join(f"{c} {integer} NOT NULL DEFAULT 0" for c in ARM_PEAKS),
    )


def draw(owner: str, conversation: str, share: float) -> Arm:
    """The arm of a new conversation: `holdout` for a `share` of them, by a hash of the owner
    and the conversation (the same in every process; no seed to share).

    >>> draw("alice", "s/1", 0.0), draw("alice", "s/1", 1.0)
    ('budget', 'holdout')
    >>> sum(draw("a", f"c{i}", 0.25) == "holdout" for i in range(4000)) / 4000
    0.25125
    """
    key = f"{owner}\0{conversation}".encode(errors="surrogatepass")
    digest = hashlib.blake2b(key, digest_size=8, person=b"ctxb-arm").digest()
    return "holdout" if int.from_bytes(digest) / 2**64 < share else "budget"


class Arms:
    """Each conversation's arm, drawn once and kept in the report's database."""

    def __init__(
        self, db: Database | PgDatabase, *, per_owner: int = PER_OWNER, owners: int = OWNERS
    ) -> None:
        self._db = db
        self._per_owner = per_owner
        self._owners = owners
        self._known: OrderedDict[str, LRUCache[str, Arm]] = OrderedDict()
        self._lock = threading.Lock()
        self._warned = False

    def known(self, owner: str, conversation: str) -> Arm | None:
        """The arm this process holds for the conversation, or None (ask `arm`)."""
        with self._lock:
            conversations = self._known.get(owner)
            return None if conversations is None else conversations.get(conversation)

    def arm(self, owner: str, conversation: str, share: float, *, at: float) -> Arm:
        """The conversation's arm: as kept, or drawn now and kept (first writer wins). Blocks
        on the database: call it from a thread."""
        found = self.known(owner, conversation)
        if found is not None:
            return found
        drawn = draw(owner, conversation, share)
        try:
            with self._db.transaction() as tx:
                tx.execute(
                    "INSERT INTO arms (owner, conversation, arm, drawn) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (owner, conversation) DO NOTHING",
                    (owner, stored(conversation), drawn, at),
                )
                rows = tx.execute(
                    "SELECT arm FROM arms WHERE owner = ? AND conversation = ?",
                    (owner, stored(conversation)),
                ).fetchall()
        except (DatabaseUnavailable, sqlite3.OperationalError) as exc:
            if not self._warned:
                self._warned = True
                log.warning("the holdout's database: %s; arms are drawn without it", exc)
            return drawn
        found = rows[0][0] if rows and rows[0][0] in ARMS else drawn
        self._remember(owner, conversation, found)
        return found

    def _remember(self, owner: str, conversation: str, arm: Arm) -> None:
        with self._lock:
            conversations = self._known.get(owner)
            if conversations is None:
                conversations = LRUCache(maxsize=self._per_owner)
                self._known[owner] = conversations
                while len(self._known) > self._owners:
                    self._known.popitem(last=False)
            self._known.move_to_end(owner)
            conversations[conversation] = arm


def billed_sums(b: dict[str, Any]) -> dict[str, Any]:
    """What one request's record (`b`, as the report's writer keeps it) adds to a row of
    billed usage and money: its conversation's here, its session's in the report store."""
    usage = b["usage"] or {}
    return {
        "requests": 1,
        "billed": int(b["usage"] is not None),
        "priced": int(b["costUsd"] is not None),
        "input": usage.get("input", 0),
        "cache_read": usage.get("cacheRead", 0),
        "cache_write": usage.get("cacheWrite", 0),
        "output": usage.get("output", 0),
        "cost_usd": b["costUsd"] or 0.0,
        "without_usd": b["withoutCtxbudgetUsd"] or 0.0,
    }


def add_requests(conn: Any, bodies: Sequence[dict[str, Any]]) -> None:
    """Add the requests of a batch that have an arm to their conversations' rows (on the
    report's writer thread, in its transaction): one upsert per conversation."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for b in bodies:
        holdout = b.get("holdout")
        if not holdout:
            continue
        key = (b["owner"], holdout["conversation"])
        acted = holdout["acted"]
        add = {
            **billed_sums(b),
            "turns": int(holdout["turn"]),
            "upstream_errors": int(b["upstreamError"] is not None),
        }
        row = rows.get(key)
        if row is None:
            rows[key] = row = {
                "arm": holdout["arm"],
                "chosen": int(holdout["chosen"]),
                "last": b["at"],
                "sums": add,
                "tool_calls": holdout["toolCalls"],
                "reruns": holdout["reruns"],
                "acted": acted,
                "acted_turns": add["turns"],
            }
            continue
        row["sums"] = {c: row["sums"][c] + add[c] for c in ARM_SUMS}
        row["chosen"] = max(row["chosen"], int(holdout["chosen"]))
        row["last"] = max(row["last"], b["at"])
        row["tool_calls"] = max(row["tool_calls"], holdout["toolCalls"])
        row["reruns"] = max(row["reruns"], holdout["reruns"])
        if acted:
            row["acted"] = True
            row["acted_turns"] = row["sums"]["turns"]
    for (owner, conversation), row in rows.items():
        conn.execute(
            _ADD,
            (
                owner,
                stored(conversation),
                row["arm"],
                row["last"],
                row["chosen"],
                row["last"],
                *(row["sums"][c] for c in ARM_SUMS),
                row["tool_calls"],
                row["reruns"],
                row["acted_turns"] if row["acted"] else -1,
            ),
        )


_ADD = (
    f"INSERT INTO arms (owner, conversation, arm, drawn, chosen, last, "
    f"{', '.join(ARM_SUMS)}, {', '.join(ARM_PEAKS)}, acted_turn) "
    f"VALUES ({', '.join('?' * (6 + len(ARM_SUMS) + len(ARM_PEAKS) + 1))}) "
    "ON CONFLICT (owner, conversation) DO UPDATE SET "
    "chosen = CASE WHEN excluded.chosen > arms.chosen THEN excluded.chosen ELSE arms.chosen END, "
    "last = CASE WHEN excluded.last > arms.last THEN excluded.last ELSE arms.last END, "
    + "".join(
        f"{c} = CASE WHEN excluded.{c} > arms.{c} THEN excluded.{c} ELSE arms.{c} END, "
        for c in ARM_PEAKS
    )
    # the turn of the conversation's last clamp or prune: its turns before this batch (the
    # SET reads the row as it was) plus the batch's turns up to that request
    + "acted_turn = CASE WHEN excluded.acted_turn >= 0 THEN arms.turns + excluded.acted_turn "
    "ELSE arms.acted_turn END, " + ", ".join(f"{c} = arms.{c} + excluded.{c}" for c in ARM_SUMS)
)
"""A batch's requests of one conversation added to its row (`add_requests`)."""


def conversations(fetchall: Any, *, owner: str | None, since: float | None) -> list[dict[str, Any]]:
    """Every conversation with an arm and at least one request written: its arm, whether it
    is out of the comparison, and its sums (one owner's, or everyone's)."""
    where: list[str] = ["requests > 0"]
    args: list[Any] = []
    if owner is not None:
        where.append("owner = ?")
        args.append(owner)
    if since is not None:
        where.append("drawn >= ?")
        args.append(since)
    columns = ("arm", "chosen", "drawn", "last", *ARM_SUMS, *ARM_PEAKS, "acted_turn")
    rows = fetchall(
        f"SELECT conversation, {', '.join(columns)} FROM arms WHERE {' AND '.join(where)}",
        args,
    )
    return [
        {"conversation": loaded(row[0]), **dict(zip(columns, row[1:], strict=True))} for row in rows
    ]
