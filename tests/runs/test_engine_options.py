"""Options the user sets are what the engine does: the budget stops a run, and the Hugging Face token reaches the
machine only when the model comes from the Hub (the checkpoints-kept setting: test_engine_end_to_end's first test).

A budget spent before training starts (the trainer is stopped as soon as it is launched) is a case of
test_engine_logic's test_a_run_over_its_budget_is_stopped_and_says_why, on an in-memory machine."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

from desktop.core.runs.progress import cost_so_far
from desktop.core.runs.states import RunState
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore
from tests.fixtures.sshd import SshHost
from tests.fixtures.tiny_models import TinyModel
from tests.runs.conftest import SpecFactory
from tests.runs.test_engine_end_to_end import engine, load, wait_local_event
from trainer_payload.protocol import CHECKPOINT_MARKER

pytestmark = pytest.mark.slow

#: $1 per second of billing.
RATE = 3600.0


def with_budget(path: Path, max_usd: float, rate: float) -> Path:
    path.write_text(path.read_text() + f"\n[budget]\nmax_usd = {max_usd}\nhourly_rate_usd = {rate}\n")
    return path


def local_checkpoints(run_id: str) -> list[Path]:
    root = RunStore().folder(run_id) / "checkpoints"
    return sorted(root.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))


def assert_ended_for_its_budget(run_id: str, budget: float) -> list[Path]:
    """The run is cancelled saying the budget was reached, at the cost the monitor shows; returns its checkpoints."""
    final, history = RunStore().get(run_id), RunStore().transitions(run_id)
    assert final.state is RunState.CANCELLED
    assert final.error is not None and history[-1]["note"] == final.error
    said = re.search(rf"budget of \${budget:,.2f} reached \(\$([\d.,]+) at \$3,600\.00/h\)", final.error)
    assert said is not None, final.error
    billed = cost_so_far(RATE, history, now=history[-1]["ts"])  # what the monitor and the status bar show
    assert budget <= float(said.group(1).replace(",", "")) <= billed
    events = mirrored_events(RunStore().folder(run_id))
    assert any(e["event"] == "state" and "SIGTERM" in str(e.get("reason")) for e in events), "asked to stop"
    assert not any(e["event"] == "done" for e in events)
    kept = [p for p in local_checkpoints(run_id) if (p / CHECKPOINT_MARKER).is_file()]
    where = f"the newest checkpoint is at {kept[-1]}" if kept else "no checkpoint had been written"
    assert where in final.error
    return kept


async def test_a_budget_reached_mid_training_brings_the_checkpoint_saved_on_stop_home(
    ssh_host: SshHost, make_spec: SpecFactory
) -> None:
    # No periodic checkpoints: one on this computer can only be the one the trainer saved when told to stop.
    spec = load(with_budget(make_spec(ssh_host, max_steps=100_000, checkpoint_steps=0), 1_000_000.0, RATE))
    runner = engine()
    record = runner.create(spec)
    assert record.spec["budget_usd"] == 1_000_000.0 and record.spec["hourly_rate_usd"] == RATE  # read from [budget]
    drive = asyncio.ensure_future(runner.drive(record.id))
    await wait_local_event(runner.folder(record.id), lambda e: e["event"] == "step" and e["step"] >= 3, 600)
    # How long setting up takes varies too much to size a budget in advance: it is lowered once training runs.
    store = RunStore()
    store.update(record.id, spec={**store.get(record.id).spec, "budget_usd": 5.0})
    await asyncio.wait_for(drive, 300)
    kept = assert_ended_for_its_budget(record.id, 5.0)
    assert kept, "the checkpoint written on SIGTERM is on this computer"


async def test_the_hf_token_reaches_the_machine_for_a_hub_model(
    ssh_host: SshHost, make_spec: SpecFactory, tiny_model: TinyModel, token_probe: tuple[Path, Path]
) -> None:
    """For a local model folder the machine gets no token: test_engine_end_to_end's happy path."""
    SecretStore().set(SecretName.HUGGINGFACE, "hf_" + "TokenOnlyForTheHub1234567890")
    wrapper, seen = token_probe
    path = make_spec(ssh_host, max_steps=3, checkpoint_steps=0)
    text = path.read_text().replace(f'python = "{sys.executable}"', f'python = "{wrapper}"')
    # not on the Hub nor in any cache: the machine fails to download it, after receiving the token
    path.write_text(text.replace(f'base = "{tiny_model.path}"', 'base = "rentune-tests/not-a-real-model"'))
    runner = engine()
    final = await asyncio.wait_for(runner.drive(runner.create(load(path)).id), 300)
    assert final.state is RunState.FAILED and "preparing the machine failed" in str(final.error)
    assert seen.read_text().split() == ["sent"]
