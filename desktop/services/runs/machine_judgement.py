"""A run judged on its machine (``[judge] on_machine``): the answers that came home, scored into the compare report.

The machine answered each held-out row with the base and the tuned model before it was let go (the export job's
``judge``, :mod:`trainer_payload.compare`); its ``judge.json`` came home verified with the export's files. Here it is
read field by field (a rented machine is untrusted input), scored with the same checks as ``rentune eval``, and
written as the report the Models page and ``rentune publish`` read (``compare/`` in the run's export folder).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from desktop.services.evaluation.judge import JudgeOptions, judge_comparison
from desktop.services.evaluation.report import summary_lines, write_reports
from desktop.services.local.compare import result_from_json
from desktop.services.local.inventory import COMPARE_FOLDER
from desktop.services.runs.context import RunContext
from desktop.services.runs.run_facts import run_facts_of
from trainer_payload.protocol import JUDGE_FILE_NAME

#: The machine's answers, kept beside the report they were scored into.
ANSWERS_FILE_NAME = "answers.json"
#: The largest ``judge.json`` read (50 rows of 128-token answers are about 100 kB; a machine may send anything).
MAX_ANSWERS_BYTES = 64 * 1024 * 1024


async def score_machine_answers(ctx: RunContext, run_id: str, folder: Path) -> Path | None:
    """Scores the machine's ``judge.json`` in ``folder`` into ``folder/compare``; returns the report's Markdown file.

    None when there is no answers file or it cannot be read (said; the user can still compare on the Models page).
    """
    answers = folder / JUDGE_FILE_NAME
    if not answers.is_file():
        return None
    record = ctx.store.get(run_id)
    spec = record.spec
    try:
        data = await asyncio.to_thread(_read_answers, answers)
        result = result_from_json(
            data,
            Path(str(spec.get("base_model"))),
            Path(str(record.adapter)),
            Path(str(spec.get("eval_file"))),
            int(data.get("usable_rows") or 0),
            judged_on="the rented machine, before it was let go",
        )
    except (OSError, ValueError, TypeError) as exc:
        ctx.report(f"the machine's answers could not be read ({exc}); compare on the Models page instead")
        return None
    judgement = judge_comparison(result, JudgeOptions(), None, await run_facts_of(ctx.store, run_id))
    out = folder / COMPARE_FOLDER
    written = await asyncio.to_thread(write_reports, judgement, out)
    answers.replace(out / ANSWERS_FILE_NAME)
    ctx.set_spec(run_id, judged_on_machine=str(written["markdown"]))
    ctx.report(f"judged on the machine: {summary_lines(judgement)[0]} Report: {written['markdown']}")
    return written["markdown"]


def _read_answers(path: Path) -> dict[str, Any]:
    """The answers file as a JSON object (bounded in size).

    Raises:
        ValueError: It is too large, not JSON, or not an object.
    """
    if path.stat().st_size > MAX_ANSWERS_BYTES:
        raise ValueError(f"{path.name} is larger than {MAX_ANSWERS_BYTES // 2**20} MB")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return data
