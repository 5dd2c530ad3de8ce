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
        ({"provider": "runpod", "nodes": 2, "self_stop_minutes": 10}, "needs send_api_key = true"),
        ({"provider": "runpod", "nodes": 1.5}, "whole number above 0"),
    ],
)
def test_what_a_cluster_cannot_be_is_one_line_with_the_fix(section: dict[str, object], words: str) -> None:
    with pytest.raises(RunSpecError, match=words):
        compute_from_dict(section)


def test_a_cluster_stops_itself_only_with_the_users_key_sent_to_its_head() -> None:
    from desktop.services.billing.rentals import Rental
    from desktop.services.providers.base import ProviderName
    from desktop.services.renting.driver import self_stop_settings

    compute = compute_from_dict({"provider": "runpod", "nodes": 2, "self_stop_minutes": 10, "send_api_key": True})
    rental = Rental(ProviderName.RUNPOD, "cluster:c1", "2 machines x 8x H100 SXM", 40.0, False, "o", 0.0)
    settings = self_stop_settings(compute, rental)
    assert settings is not None and settings["send_api_key"] and settings["instance_id"] == "cluster:c1"
    pod = compute_from_dict({"provider": "runpod", "self_stop_minutes": 10, "send_api_key": True})
    one = self_stop_settings(pod, Rental(ProviderName.RUNPOD, "pod-1", "H100", 3.0, False, "o", 0.0))
    assert one is not None and not one["send_api_key"], "a pod stops itself with its own key: nothing is sent"
