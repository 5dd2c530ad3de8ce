"""The first measured steps against the plan, with real parts: ``rentune run --on-overrun stop`` rents a machine at
the fake RunPod (a real sshd), whose real payload measures its first steps on the CPU, far slower than the plan for
the RTX 4090 it was sold as; the run stops at that measure, the checkpoint comes home and the machine is terminated.

The many cases (ask, continue, a reattached app) run in-process in test_overrun.
"""

from __future__ import annotations

import pytest

from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.services.runs.checkpoints import newest_local_checkpoint
from desktop.services.runs.store import RunStore
from tests.runs.test_rented_runs import (  # noqa: F401 - runpod and rented_spec: the fixtures
    CloudUnderTest,
    SpecWriter,
    _assert_ledger_matches,
    _nothing_left,
    rented_spec,
    runpod,
)

pytestmark = pytest.mark.slow


def test_a_run_slower_than_its_plan_stops_at_its_first_measure_with_the_checkpoint_home(
    runpod: CloudUnderTest,  # noqa: F811
    rented_spec: SpecWriter,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 100,000 steps: the plan's minutes of setup hide a tiny job's pace, a long one's cannot (the CPU's steps take
    # thousands of times the 4090's)
    training = {"max_steps": 100_000, "calibration_steps": 3, "checkpoint_steps": 2}
    spec = rented_spec(runpod, training=training)
    main(["run", str(spec), "--on-overrun", "stop"])
    out = capsys.readouterr().out
    [run] = RunStore().all()
    assert run.state is RunState.CANCELLED, (run.error, out[-2000:])
    assert str(run.error).startswith("measured in the first steps: about "), run.error
    assert "against the estimate of" in str(run.error) and run.spec["measured"]["step"] >= 3
    assert newest_local_checkpoint(RunStore().folder(run.id) / "checkpoints") is not None, "the checkpoint is home"
    [instance] = runpod.fake.instances.values()
    assert instance.terminated is not None
    _nothing_left(runpod.fake)
    _assert_ledger_matches(runpod.fake, run.id)
