"""A run's place among several machines, as its record says: the keys its job gets, where its checkpoints live."""

from __future__ import annotations

from typing import Any

from desktop.services.runs.store import RunRecord

#: The run spec's key for the machines of a run across several.
CLUSTER_KEY = "cluster"


def cluster_of(record: RunRecord) -> dict[str, Any]:
    """The run's place among several machines, or an empty dict for a run on one machine.

    Keys: ``num_nodes``, ``node_rank``, ``head_address``, ``head_port``, and ``head`` (the run) on its other machines.
    """
    return dict(record.spec.get(CLUSTER_KEY) or {})


def node_job_keys(spec: dict[str, Any]) -> dict[str, Any]:
    """The job keys that place one machine in its run (empty on one machine): the payload launches from them."""
    cluster = spec.get(CLUSTER_KEY) or {}
    keys = ("num_nodes", "node_rank", "head_address", "head_port")
    return {key: cluster[key] for key in keys} if cluster else {}


def checkpoints_from(record: RunRecord) -> str:
    """Whose local folder holds the run's checkpoints: the head's, for every machine of a run."""
    return str(cluster_of(record).get("head") or record.id)
