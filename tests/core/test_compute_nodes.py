"""``[compute] nodes``: several machines rented as one cluster, where a provider rents clusters."""

from __future__ import annotations

import pytest

from desktop.core.runs.spec import RunSpecError, compute_from_dict


def test_a_runpod_cluster_of_two_machines_is_read() -> None:
    compute = compute_from_dict({"provider": "runpod", "gpu": "H100 SXM", "count": 8, "nodes": 2})
    assert (compute.nodes, compute.count) == (2, 8)
    assert compute_from_dict({"provider": "vast"}).nodes == 1


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"provider": "vast", "nodes": 2}, "only RunPod rents several machines as one cluster"),
        ({"provider": "runpod", "providers": ["vast"], "nodes": 2}, "without other providers"),
        ({"provider": "runpod", "nodes": 251}, "2 to 250 machines"),
        ({"provider": "runpod", "nodes": 2, "spot": True}, "not sold as spot"),
        ({"provider": "runpod", "nodes": 2, "self_stop_minutes": 10}, "no self-stop"),
        ({"provider": "runpod", "nodes": 1.5}, "whole number above 0"),
    ],
)
def test_what_a_cluster_cannot_be_is_one_line_with_the_fix(section: dict[str, object], words: str) -> None:
    with pytest.raises(RunSpecError, match=words):
        compute_from_dict(section)
