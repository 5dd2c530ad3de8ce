"""Objectives beyond SFT end to end: ``rentune run`` trains on the machine (a real sshd, the real payload) preference
pairs with DPO (the terminal shows how often the chosen answer wins) and raw text with continued pre-training (the
terminal shows the held-out perplexity before and after); each adapter comes home verified."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.snapshot import local_files
from desktop.services.runs.store import RunStore
from desktop.services.serving.dashboards import Tracker, start_dashboard
from tests.fakes.wandb_server import FakeWandb
from tests.fixtures.domain_text import write_domain_text
from tests.fixtures.preference_data import write_preference_dataset
from tests.fixtures.secret_watch import ArgvWatch
from tests.fixtures.sshd import SshHost
from tests.runs.conftest import SpecFactory
from trainer_payload.checkpoints import is_complete

pytestmark = pytest.mark.slow


async def tensorboard_tags(logs: Path) -> set[str]:
    """The scalar tags a local TensorBoard shows for ``logs`` (started, asked over HTTP, stopped)."""
    import httpx

    board = await start_dashboard(Tracker.TENSORBOARD, logs)
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            tags = (await client.get(f"{board.url}data/plugin/scalars/tags")).json()
    finally:
        await board.stop()
    return {tag for run_tags in tags.values() for tag in run_tags}


async def trackio_losses(logs: Path, run: str) -> list[float]:
    """The train/loss a local trackio dashboard shows for ``run`` (started, asked over HTTP, stopped)."""
    import httpx

    board = await start_dashboard(Tracker.TRACKIO, logs)
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            asked = {"project": "rentune", "run": run, "scalar_only": True}
            rows = (await client.post(f"{board.url}api/get_logs", json=asked)).json()["data"]
    finally:
        await board.stop()
    return [row["train/loss"] for row in rows if "train/loss" in row]


def test_rentune_run_trains_a_dpo_adapter_on_the_machine_and_brings_it_home(
    ssh_host: SshHost, make_spec: SpecFactory, chat_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = write_preference_dataset(tmp_path / "pairs.jsonl", 64)
    held_out = write_preference_dataset(tmp_path / "held-out.jsonl", 12)  # one pair per question of the pattern
    spec = make_spec(ssh_host, objective="dpo", beta=0.1, max_steps=20, eval_steps=10)
    train_line = f'train = "{chat_dataset}"'
    text = spec.read_text().replace(train_line, f'train = "{pairs}"\neval = "{held_out}"')
    spec.write_text(text + '\n[tracking]\nreport_to = ["tensorboard", "trackio"]\n')
    assert main(["run", str(spec)]) == 0, capsys.readouterr().out[-3000:]
    out = capsys.readouterr().out
    assert "adapter verified" in out and "chosen preferred" in out, out[-2000:]
    assert main(["runs", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert run["state"] == "finished"
    adapter = Path(run["adapter"])
    assert is_complete(adapter) and (adapter / "adapter_model.safetensors").is_file()
    steps = [e for e in mirrored_events(adapter.parent) if e["event"] == "step"]
    assert len(steps) == 20 and steps[-1]["reward_margin"] > steps[0]["reward_margin"]
    assert sum(e["reward_accuracy"] for e in steps[-5:]) / 5 >= 0.8, "the machine's run learned the preference"
    evals = [e for e in mirrored_events(adapter.parent) if e["event"] == "eval"]
    assert [e["step"] for e in evals][-1] == 20 and all("reward_accuracy" in e for e in evals)
    # TensorBoard's event files came home inside the adapter (sealed with it), and a local TensorBoard shows them.
    logs = local_files(RunStore(), RunStore().get(run["id"])).tensorboard
    assert logs == adapter / "tensorboard" and is_complete(adapter)
    tags = asyncio.run(tensorboard_tags(logs))
    assert {"train/loss", "train/rewards/accuracies", "eval/rewards/margins"} <= tags, tags
    # So did trackio's database, and a local trackio dashboard shows every step's loss under the run's id.
    trackio = local_files(RunStore(), RunStore().get(run["id"])).trackio
    assert trackio == adapter / "trackio"
    assert asyncio.run(trackio_losses(trackio, run["id"])) == pytest.approx([e["loss"] for e in steps], rel=1e-4)
    # The comparison after training: on the held-out pairs the tuned model prefers the chosen answer more often.
    assert main(["eval", run["id"], "--json", "--out", str(tmp_path / "compare")]) == 0
    report = json.loads(capsys.readouterr().out)
    preference = report["preference"]
    assert json.loads(Path(report["report"]["json"]).read_text())["preference"] == preference
    assert preference["rows"] == 12 and preference["tuned"] > preference["base"], preference
    assert preference["tuned"] >= 0.75 and preference["fixed"] > preference["broke"], preference


def test_rentune_run_continues_pretraining_on_a_text_file_and_says_the_perplexity_before_and_after(
    ssh_host: SshHost, make_spec: SpecFactory, chat_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus, held_out = write_domain_text(tmp_path / "corpus.txt", 30), write_domain_text(tmp_path / "held.txt", 3, 1)
    spec = make_spec(ssh_host, objective="cpt", max_steps=20, eval_steps=10)
    text = spec.read_text().replace(f'train = "{chat_dataset}"', f'train = "{corpus}"\neval = "{held_out}"')
    wandb = FakeWandb().start()
    spec.write_text(text + f'\n[tracking]\nreport_to = ["wandb"]\nproject = "domain"\nwandb_url = "{wandb.url}"\n')
    SecretStore().set(SecretName.WANDB, wandb.api_key)  # as Settings or `rentune keys set wandb` keep it
    try:
        with ArgvWatch(wandb.api_key) as watch:
            assert main(["run", str(spec)]) == 0, capsys.readouterr().out[-3000:]
    finally:
        wandb.stop()
    out = capsys.readouterr().out
    before, after = (
        float(n) for n in re.search(r"perplexity ([\d,.]+) before training, ([\d,.]+) after", out).groups()
    )
    assert after < before and "adapter verified" in out
    (job,) = (tmp_path / "remote").glob("*/job.json")
    assert json.loads(job.read_text())["train_file"] == "data/train.txt", "the text keeps its suffix on the machine"
    # W&B got every step from the machine under the run's id, in the spec's project; its key was on no command line
    # and in no file, at home or on the machine.
    (run_id,) = wandb.runs
    losses = [row["train/loss"] for row in wandb.runs[run_id].history if "train/loss" in row]
    assert len(losses) == 20 and wandb.runs[run_id].project == "domain" and wandb.runs[run_id].complete
    assert watch.samples > 10 and not watch.leaks, watch.leaks[:3]
    for root in (tmp_path / "remote", Path(os.environ["RENTUNE_HOME"])):
        for path in root.rglob("*"):
            assert not (path.is_file() and wandb.api_key.encode() in path.read_bytes()), f"the W&B key is in {path}"
