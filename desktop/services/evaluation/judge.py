"""Judge a fine-tune: base and tuned answer the held-out rows, task checks score both, and a report says the verdict.

The answers and losses come from :func:`desktop.services.local.compare.compare_adapter` (both models, greedy, on
this computer); the checks are chosen from the reference answers (:mod:`desktop.core.judging.checks`), with the
user's regular expression and JSON Schema when given. The report (:mod:`desktop.services.evaluation.report`) adds the
run's loss curves and what it cost.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from desktop.core.judging.checks import CheckKind, choose_checks, parse_json, passes, regex_problem
from desktop.core.judging.preference import PreferenceCheck
from desktop.core.judging.verdict import RowScore, Verdict, judge
from desktop.services.evaluation.general import GeneralCheck, check_general_ability
from desktop.services.evaluation.preference import check_preferences, read_pairs
from desktop.services.evaluation.report import write_reports
from desktop.services.evaluation.run_facts import RunFacts
from desktop.services.local.base_model import local_base
from desktop.services.local.common import LocalInputError, Progress, no_progress
from desktop.services.local.compare import CompareResult, compare_adapter
from desktop.services.platform.secrets import SecretStore


@dataclass(frozen=True)
class JudgeOptions:
    """The user's own checks, beside the ones chosen from the data.

    Attributes:
        regex: A regular expression a right answer matches, or None.
        schema_file: A JSON Schema file a right JSON answer satisfies, or None.
        max_examples: Held-out rows used at most.
        max_new_tokens: Longest answer generated, in tokens.
        general: Also check general ability with lm-evaluation-harness (:mod:`.general`).
    """

    regex: str | None = None
    schema_file: Path | None = None
    max_examples: int = 50
    max_new_tokens: int = 128
    general: bool = False


@dataclass(frozen=True)
class Judgement:
    """The evaluation as a whole: answers, losses, checks, rows scored, verdict, run and the optional checks.

    ``general`` is the general-ability check (when asked for); ``preference`` the preference check, made whenever
    the held-out rows are preference pairs (a DPO or ORPO run).
    """

    comparison: CompareResult
    checks: list[CheckKind]
    rows: list[RowScore]
    verdict: Verdict
    run: RunFacts | None
    general: GeneralCheck | None = None
    preference: PreferenceCheck | None = None


def read_schema(path: Path) -> dict[str, Any]:
    """The JSON Schema in ``path``, checked to be a schema.

    Raises:
        LocalInputError: The file cannot be read, is not JSON, or is not a valid JSON Schema.
    """
    from jsonschema import SchemaError, validators

    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LocalInputError(f"{path} cannot be read ({exc.strerror or exc}): give a JSON Schema file") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise LocalInputError(f"{path} is not JSON ({exc}): give a JSON Schema file") from None
    try:
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise LocalInputError(f"{path} is not a valid JSON Schema ({exc.message}): fix the schema") from None
    if not isinstance(schema, dict):
        raise LocalInputError(f'{path} is not a JSON Schema object: give a schema like {{"type": "object"}}')
    return schema


def check_options(options: JudgeOptions) -> dict[str, Any] | None:
    """Checks the user's regular expression and schema before anything loads; returns the schema (None without).

    Raises:
        LocalInputError: The regular expression does not compile, or the schema file is not a schema.
    """
    if options.regex is not None and (problem := regex_problem(options.regex)):
        raise LocalInputError(problem)
    return read_schema(options.schema_file) if options.schema_file is not None else None


def score_rows(
    result: CompareResult, checks: list[CheckKind], *, regex: str | None, schema: dict[str, Any] | None
) -> list[RowScore]:
    """Each compared row with every check's result for both answers."""
    validator = _validator(schema)

    def results(reference: str, answer: str) -> dict[CheckKind, bool]:
        found: dict[CheckKind, bool] = {}
        for kind in checks:
            if kind is CheckKind.JSON_SCHEMA:
                value = parse_json(answer)
                found[kind] = value is not None and validator is not None and bool(validator.is_valid(value))
            else:
                found[kind] = passes(kind, reference, answer, regex=regex)
        return found

    return [
        RowScore(
            e.line,
            e.prompt,
            e.reference,
            e.base_answer,
            e.tuned_answer,
            results(e.reference, e.base_answer),
            results(e.reference, e.tuned_answer),
        )
        for e in result.examples
    ]


def _validator(schema: dict[str, Any] | None) -> Any:
    if schema is None:
        return None
    from jsonschema import validators

    return validators.validator_for(schema)(schema)


def judge_comparison(
    result: CompareResult, options: JudgeOptions, schema: dict[str, Any] | None, run: RunFacts | None
) -> Judgement:
    """Scores a comparison's answers and gives the verdict."""
    references = [example.reference for example in result.examples]
    checks = choose_checks(references, regex=options.regex, schema=schema is not None)
    rows = score_rows(result, checks, regex=options.regex, schema=schema)
    return Judgement(result, checks, rows, judge(rows, checks), run)


async def judge_and_report(
    base: str | None,
    adapter: Path,
    eval_file: Path,
    out: Path,
    *,
    options: JudgeOptions = JudgeOptions(),
    run: RunFacts | None = None,
    progress: Progress = no_progress,
    secrets: SecretStore | None = None,
) -> tuple[Judgement, dict[str, Path]]:
    """Finds (or downloads) the base, compares, judges, and writes the report (Markdown, HTML, JSON) into ``out``.

    Cancelling the awaiting task stops a download at its next chunk and the comparison before its next row; no
    report is written then.

    Returns:
        The judgement, and the report files by format (``markdown``, ``html``, ``json``).

    Raises:
        LocalToolError: Bad options, a base that cannot be found or downloaded, or a failed comparison.
    """
    schema = check_options(options)
    folder = await local_base(base, progress, secrets)
    result = await compare_adapter(
        folder,
        adapter,
        eval_file,
        max_examples=options.max_examples,
        max_new_tokens=options.max_new_tokens,
        progress=progress,
    )
    judgement = judge_comparison(result, options, schema, run)
    pairs = read_pairs(eval_file, options.max_examples)
    if pairs:
        judgement = replace(judgement, preference=await check_preferences(folder, adapter, pairs, progress))
    if options.general:
        judgement = replace(judgement, general=await check_general_ability(folder, adapter, progress))
    written = await asyncio.to_thread(write_reports, judgement, out)
    return judgement, written
