"""Validation per drain episode, counted in the database.

Every drain babysitter makes of a node (the node policy's, a held drain carried out later, a
switch incident's, an NVLink domain incident's) starts a new drain episode: the node row's
`drain_episode` is set to the newest action id at that moment. The node's validation history
is its `validate` actions recorded after that id, read with one grouped query (not a listing
of the newest actions, which misses a node's validation behind thousands of other actions).
So a validation that passed in an earlier, unrelated episode never returns the node now.

The validation's own drains (a failed verdict, a verdict late at its reservation's end) and
the healer's continue the episode: they are what the failure count counts. An admin's drain
is theirs and starts nothing.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import Connection, bindparam, case, func, select, update

from babysitter.controller.db import models as m
from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.store import Store, stored_status
from babysitter.controller.db.validation_state import (  # noqa: F401 (re-exported)
    FAILED,
    PASSED,
    RUNNING,
    NodeValidation,
    state_of,
    validated_for_this_drain,
)


def episode_start() -> Any:
    """The value `drain_episode` takes when a drain starts an episode: the newest action id
    now (the drain's own action is recorded before it is carried out)."""
    return select(func.coalesce(func.max(m.actions.c.id), 0)).scalar_subquery()


def start_episodes(c: Connection, nodes: Collection[str]) -> None:
    """In the drain's own transaction: each of `nodes` starts a new drain episode."""
    if nodes:
        n = m.nodes
        c.execute(
            update(n).where(n.c.name.in_(sorted(nodes))).values(drain_episode=episode_start())
        )


def start_drain_episodes(store: Store, nodes: Collection[str]) -> None:
    with store.engine.begin() as c:
        start_episodes(c, nodes)


def _validations_query(named: bool) -> Any:
    """The latest validation per node in its current episode, and its episode's failures (of
    the nodes in the expanding `names` parameter when `named`)."""
    a, n = m.actions.c, m.nodes.c
    failed = func.sum(case((a.status == str(ActionStatus.FAILED), 1), else_=0))
    per = (
        select(a.node, func.max(a.id).label("latest"), failed.label("failures"))
        .select_from(m.actions.outerjoin(m.nodes, n.name == a.node))
        .where(a.kind == str(ActionKind.VALIDATE), a.id > func.coalesce(n.drain_episode, 0))
        .group_by(a.node)
    )
    if named:
        per = per.where(a.node.in_(bindparam("names", expanding=True)))
    sub = per.subquery()
    return select(sub.c.node, a.status, sub.c.failures).join(m.actions, a.id == sub.c.latest)


# built once: every tick reads it (building it and working out its cache key cost more than
# running it)
_VALIDATIONS = _validations_query(False)
_VALIDATIONS_NAMED = _validations_query(True)


def validation_history(
    store: Store, names: Collection[str] | None = None
) -> dict[str, NodeValidation]:
    """Per node (of `names`, or every node with one): its validations in its current drain
    episode. A node without a row, or never drained by babysitter, counts all of its own."""

    def read() -> dict[str, NodeValidation]:  # built only when not remembered
        q, params = _VALIDATIONS, {}
        if names is not None:
            q, params = _VALIDATIONS_NAMED, {"names": sorted(names)}
        out: dict[str, NodeValidation] = {}
        with store.reading() as c:
            for node, status, failures in c.execute(q, params):
                if node:
                    state = state_of(stored_status(status))
                    out[str(node)] = NodeValidation(state, int(failures or 0))
        return out

    key = ("validations", None if names is None else tuple(sorted(names)))
    # the ingest's writes to nodes touch no drain_episode: they leave this read good, and so
    # do the tick's own writes of actions other than validations
    got = store.reads.read(("actions", "nodes.drain_episode"), key, read, _unless_validations)
    return dict(got)


def _unless_validations(
    value: dict[str, NodeValidation], rows: list[Action]
) -> dict[str, NodeValidation] | None:
    return None if any(r.kind is ActionKind.VALIDATE for r in rows) else value
