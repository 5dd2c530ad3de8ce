"""Renting: offers from three providers merged and ranked, and the paid idle time of one rented run.

The three fake clouds of ``tests/fakes/`` serve over real HTTP on loopback (as the real APIs would, minus the
network's latency). Offers: ``gather_offers`` asks them at once and ``size_offers`` ranks them against a 7B QLoRA plan;
the baseline asks the same three one after another. The cold ``rentune offers --json`` process is shown beside it.
Paid idle: one rented run of the tiny model on the fake RunPod (a real sshd machine, the real payload on the CPU):
seconds from creating the machine to the first training step, and from the adapter arriving home to the machine
terminated (target: under 30 s).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from desktop.core.sizing.offers import SizingJob
from desktop.core.sizing.plan import Workload
from desktop.core.sizing.setup import DEFAULT_SETUP
from desktop.services.billing.ledger import Ledger
from desktop.services.models.configs import load_gpus, resolve_model
from desktop.services.providers.base import OfferQuery, ProviderName
from desktop.services.providers.market import gather_offers, size_offers
from tests.benchmarks.common import PYTHON, Row, print_table
from tests.fakes.lambda_cloud import FakeLambda
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast
from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.tiny_models import TINY_TRAINING, build_tiny_model

RUNS = 15


@contextmanager
def three_clouds(root: Path) -> Iterator[dict[str, str]]:
    """Serves the three fakes; yields the environment that points Rentune at them (URLs and keys)."""
    clouds = [FakeRunPod(root / "runpod"), FakeVast(root / "vast"), FakeLambda(root / "lambda")]
    try:
        runpod, vast, lam = (cloud.serve() for cloud in clouds)
        yield {
            "RENTUNE_RUNPOD_URL": runpod,
            "RENTUNE_VAST_URL": vast + "/api/v0",
            "RENTUNE_LAMBDA_URL": lam + "/api/v1",
            "RUNPOD_API_KEY": clouds[0].valid_key,
            "VAST_API_KEY": clouds[1].valid_key,
            "LAMBDA_API_KEY": clouds[2].valid_key,
        }
    finally:
        for cloud in clouds:
            cloud.close()


async def _ranked(names: list[ProviderName], job: SizingJob) -> int:
    market = await gather_offers(OfferQuery(), names)
    return len(size_offers(market.offers, job, list(load_gpus())))


async def _one_after_another(names: list[ProviderName], job: SizingJob) -> int:
    offers = []
    for name in names:
        offers += (await gather_offers(OfferQuery(), [name])).offers
    return len(size_offers(offers, job, list(load_gpus())))


def offers_rows(env: dict[str, str]) -> list[Row]:
    """Merged offers: at once against one after another, interleaved; and the cold CLI process."""
    os.environ.update(env)
    job = SizingJob(resolve_model("qwen2.5-7b"), DEFAULT_SETUP, Workload())
    names = list(ProviderName)
    samples: dict[str, list[float]] = {"together": [], "sequential": [], "cli": []}
    counts = set()
    for _ in range(RUNS):
        for name, work in (("together", _ranked), ("sequential", _one_after_another)):
            start = time.perf_counter()
            counts.add(asyncio.run(work(names, job)))
            samples[name].append(time.perf_counter() - start)
    command = [PYTHON, "-m", "desktop", "offers", "--model", "qwen2.5-7b", "--json"]
    for _ in range(5):
        start = time.perf_counter()
        out = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ | env).stdout
        samples["cli"].append(time.perf_counter() - start)
    print(f"offers ranked: {sorted(counts)}; the CLI printed {len(json.loads(out))} offers")
    together, sequential = statistics.median(samples["together"]), statistics.median(samples["sequential"])
    cli = statistics.median(samples["cli"])
    return [
        Row("offers of 3 providers merged+ranked", together, sequential, "s", "< 1 s", together < 1.0),
        Row("rentune offers --json (cold process)", cli, None, "s", "info", True),
    ]


def paid_idle_rows(root: Path) -> list[Row]:
    """One rented tiny run on the fake RunPod: machine created to first step, adapter home to terminated."""
    from desktop.core.runs.spec import run_spec_from_dict
    from desktop.services.renting.driver import RentalDriver, RentalOptions
    from desktop.services.runs.engine import EngineOptions, RunEngine
    from desktop.services.runs.estimates import paid_idle
    from desktop.services.runs.store import RunStore

    model = build_tiny_model(root / "model")
    data = write_chat_dataset(root / "train.jsonl")
    compute = {"provider": "runpod", "gpu": "RTX 4090", "python": sys.executable, "user": getpass.getuser()}
    spec = run_spec_from_dict(
        {
            "model": {"base": str(model.path)},
            "data": {"train": str(data)},
            "training": TINY_TRAINING,
            "compute": compute,
        },
        root,
    )
    engine = RunEngine(RunStore(), options=EngineOptions(poll_seconds=0.5))
    driver = RentalDriver(engine, options=RentalOptions(poll_seconds=2, ready_poll_seconds=1))
    record = engine.create(spec)
    record = asyncio.run(driver.drive(record.id))
    idle = paid_idle(record, engine.store.transitions(record.id), Ledger().rentals(record.id), engine.folder(record.id))
    before, after = idle["create_to_first_step_s"] or -1.0, idle["adapter_to_terminate_s"] or -1.0
    print(f"the rented run ended {record.state.value}; tiny model, CPU, image and model already on the 'machine'")
    return [
        Row("paid idle: created to first step", before, None, "s", "info (CPU bootstrap)", True),
        Row("paid idle: adapter home to terminated", after, None, "s", "< 30 s", 0 <= after < 30),
    ]


def run() -> bool:
    import keyring

    from tests.fixtures.memory_keyring import MemoryKeyring

    keyring.set_keyring(MemoryKeyring())  # the run's SSH key lives in a keyring; this machine may have none
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["RENTUNE_HOME"] = str(root / "home")
        with three_clouds(root / "clouds") as env:
            rows = offers_rows(env)
            rows += paid_idle_rows(root)
    return print_table(rows)
