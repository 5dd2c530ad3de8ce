"""``[target] hosts``: one run across several machines, the head first, each its own SSH host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from desktop.core.runs.spec import DEFAULT_HEAD_PORT, RunSpecError, run_spec_from_dict

HOSTS = ["ssh://me@gpu-a:22", "ssh://me@gpu-b:2222", "ssh://me@gpu-c:22"]


def spec_data(target: dict[str, Any], **training: Any) -> dict[str, Any]:
    return {"model": {"base": "org/model"}, "data": {"train": "t.jsonl"}, "target": target, "training": training}


def test_hosts_make_the_first_the_head_and_the_others_its_nodes_in_rank_order() -> None:
    spec = run_spec_from_dict(spec_data({"hosts": HOSTS, "python": "/opt/py"}), Path("/runs"))
    assert spec.target is not None and spec.target.url == HOSTS[0] and spec.target.python == "/opt/py"
    assert [node.url for node in spec.nodes] == HOSTS[1:] and all(n.python == "/opt/py" for n in spec.nodes)
    assert (spec.num_nodes, spec.head_address, spec.head_port) == (3, "gpu-a", DEFAULT_HEAD_PORT)


def test_the_head_address_and_port_the_others_use_can_be_given() -> None:
    spec = run_spec_from_dict(spec_data({"hosts": HOSTS[:2], "head_address": "10.0.0.5", "head_port": 40000}), Path())
    assert (spec.head_address, spec.head_port) == ("10.0.0.5", 40000)


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ({"hosts": HOSTS[:1]}, "two or more machines"),
        ({"hosts": "ssh://me@gpu-a:22"}, "two or more machines"),
        ({"hosts": [HOSTS[0], HOSTS[0]]}, "names a machine twice"),
        ({"hosts": HOSTS, "ssh": HOSTS[0]}, "not both"),
        ({"hosts": HOSTS, "host_key": "ssh-ed25519 AAAAC3Nz"}, "pinned on first contact"),
        ({"hosts": ["gpu-a", "gpu-b"]}, "must look like ssh://user@host:port"),
        ({"ssh": HOSTS[0], "head_address": "10.0.0.5"}, "give it with hosts"),
        ({"hosts": HOSTS, "head_port": 80}, "from 1024 to 65535"),
    ],
)
def test_a_wrong_hosts_table_is_one_line_naming_the_fix(target: dict[str, Any], words: str) -> None:
    with pytest.raises(RunSpecError, match=words):
        run_spec_from_dict(spec_data(target), Path("/runs"))


@pytest.mark.parametrize("key", ["num_nodes", "node_rank", "head_address", "head_port"])
def test_the_machine_keys_of_the_job_are_not_set_by_hand(key: str) -> None:
    with pytest.raises(RunSpecError, match=r"\[target\] hosts names the machines"):
        run_spec_from_dict(spec_data({"hosts": HOSTS}, **{key: 1}), Path("/runs"))


def test_servers_typed_one_per_line_become_the_runs_machines_with_the_heads_settings() -> None:
    from desktop.core.runs.spec import SshTarget, targets_from_lines

    base = SshTarget("me", "old", 22, Path("/keys/id"), "python3.12", "/scratch/runs", None, "ssh-ed25519 AAAA pinned")
    text = "\n ssh://me@a:2222 \nyou@b\n\n"
    head, node = targets_from_lines(text, base, 2)
    assert (head.url, node.url) == ("ssh://me@a:2222", "ssh://you@b:22")
    assert node.identity == Path("/keys/id") and node.python == "python3.12" and node.workdir == "/scratch/runs"
    assert head.host_key is None and node.host_key is None, "new servers: pinned on first contact"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("me@a:22", "trains on 2 machines: give one server per line \\(1 given\\)"),
        ("me@a:22\nme@a:22", "named twice"),
        ("me@a:22\nb-without-user", "must look like ssh://user@host:port"),
        ("me@a:22\nme@b:port", "the port must be a number"),
    ],
)
def test_servers_typed_wrongly_say_what_is_wrong(text: str, problem: str) -> None:
    from desktop.core.runs.spec import SshTarget, targets_from_lines

    with pytest.raises(RunSpecError, match=problem):
        targets_from_lines(text, SshTarget("me", "old", 22), 2)
