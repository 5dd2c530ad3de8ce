"""A rented run the user stopped resumes on a newly rented machine from the checkpoint at home, and finishes.

Against the fake RunPod, whose machines are real sshd servers on loopback, training the tiny model with the real
payload (the fixtures of ``test_rented_runs``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.machines.keys import load_run_key
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore
from tests.fixtures.domain_text import write_domain_text
from tests.fixtures.preference_data import write_preference_dataset
from tests.payload.test_trackers import logged_losses
from tests.runs.test_rented_runs import (  # noqa: F401 - fixtures
    CloudUnderTest,
    SpecWriter,
    _create,
    _driver,
    _nothing_left,
    rented_spec,
    runpod,
)
from trainer_payload.protocol import EventKind, JobState

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.parametrize("objective", ["sft", "dpo", "orpo", "cpt"])
def test_a_stopped_rented_run_resumes_on_a_new_machine_and_finishes(
    runpod: CloudUnderTest,  # noqa: F811 - the fixture imported above
    rented_spec: SpecWriter,  # noqa: F811 - the fixture imported above
    chat_dataset: Path,
    tmp_path: Path,
    objective: str,
) -> None:
    """Each objective: DPO's and ORPO's pairs and CPT's raw text go up to each machine, both machines report the
    objective's metrics; CPT's run reports to trackio, whose database the second machine continues."""
    engine, driver = _driver()
    spec = rented_spec(runpod, training={"max_steps": 400, "checkpoint_steps": 3, "objective": objective})
    data = {
        "dpo": lambda: write_preference_dataset(tmp_path / "pairs.jsonl", 64),
        "orpo": lambda: write_preference_dataset(tmp_path / "pairs.jsonl", 64),
        "cpt": lambda: write_domain_text(tmp_path / "corpus.txt", 30),
    }
    if objective in data:
        text = spec.read_text().replace(f'train = "{chat_dataset}"', f'train = "{data[objective]()}"')
        spec.write_text(text + ('\n[tracking]\nreport_to = ["trackio"]\n' if objective == "cpt" else ""))
    run_id = _create(engine, spec)
    folder = engine.folder(run_id)

    async def stop_after_a_checkpoint() -> RunState:
        drive = asyncio.ensure_future(driver.drive(run_id))
        for _ in range(3000):  # until a checkpoint is safe on this computer
            if list(folder.glob("checkpoints/checkpoint-*/rentune_checkpoint.json")):
                break
            await asyncio.sleep(0.1)
        await engine.request_stop(run_id)  # what the monitor's Stop does while the app follows the run
        return (await drive).state

    assert asyncio.run(stop_after_a_checkpoint()) is RunState.CANCELLED
    [first] = runpod.fake.instances.values()
    assert first.terminated is not None, "a stopped rented run bills nothing"

    stopped = RunStore().get(run_id)
    end = max(e["step"] for e in mirrored_events(folder) if e["event"] is EventKind.CHECKPOINT) + 2
    RunStore().update(run_id, spec={**stopped.spec, "training": {**stopped.spec["training"], "max_steps": end}})
    resumed = engine.prepare_resume(run_id)
    assert resumed.state is RunState.PAUSED and load_run_key(run_id) is not None
    _engine, second_driver = _driver()
    assert asyncio.run(second_driver.drive(run_id)).state is RunState.FINISHED

    first, second = runpod.fake.instances.values()
    assert second.terminated is not None
    events = mirrored_events(folder)
    training = [e for e in events if e["event"] is EventKind.STATE and e["state"] == JobState.TRAINING]
    assert str(training[-1].get("resume_from", "")).startswith("checkpoint-")
    assert [r.instance_id for r in Ledger().rentals(run_id)] == [first.id, second.id]
    _nothing_left(runpod.fake)
    steps = [e for e in events if e["event"] is EventKind.STEP]
    preference = objective in {"dpo", "orpo"}
    assert all(("reward_accuracy" in e) == preference for e in steps), "the rewards of DPO and ORPO, on both machines"
    if objective == "cpt":  # the second machine continued the first one's trackio database from the checkpoint
        database = Path(RunStore().get(run_id).adapter or "") / "trackio" / "rentune.db"
        logged = sorted(step for step, _loss in logged_losses(database).items())
        assert logged == sorted({e["step"] for e in steps}), (logged, [e["step"] for e in steps])
