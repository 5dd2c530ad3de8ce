"""Task checks and the verdict: which check the references call for, what counts as right, the flips and their test."""

from __future__ import annotations

from math import comb

import pytest

from desktop.core.judging.checks import CheckKind, choose_checks, is_label_set, normalise, passes, regex_problem
from desktop.core.judging.verdict import Outcome, RowScore, judge, mcnemar_p


def _row(line: int, reference: str, base: str, tuned: str, checks: list[CheckKind]) -> RowScore:
    def results(answer: str) -> dict[CheckKind, bool]:
        return {kind: passes(kind, reference, answer) for kind in checks}

    return RowScore(line, f"question {line}", reference, base, tuned, results(base), results(tuned))


def test_normalising_drops_case_spaces_quotes_fences_and_closing_marks_only() -> None:
    assert normalise("  The  Answer is 42.  ") == "the answer is 42"
    assert normalise('"Paris!"') == "paris"
    assert normalise("```text\nPositive\n```") == "positive"
    assert normalise("\u201cyes\u201d") == "yes"
    assert normalise("3.5") == "3.5" and normalise("a.b") == "a.b", "only closing marks go"
    assert normalise("not 42") != normalise("42")


@pytest.mark.parametrize(
    ("references", "expected"),
    [
        (['{"name": "Ada", "age": 36}', '```json\n{"name": "Bo", "age": 7}\n```'], [CheckKind.JSON_KEYS]),
        (["positive", "negative", "Positive.", "neutral", "negative", "positive"], [CheckKind.LABEL]),
        (["Paris is the capital.", "Berlin, I think.", "Rome, of course."], [CheckKind.NORMALISED, CheckKind.EXACT]),
        (["yes", "no", "maybe"], [CheckKind.NORMALISED, CheckKind.EXACT]),  # too few rows to call them labels
    ],
    ids=["json", "labels", "free-text", "three-rows"],
)
def test_the_checks_follow_what_the_references_look_like(references: list[str], expected: list[CheckKind]) -> None:
    assert choose_checks(references) == expected


def test_a_schema_decides_for_json_and_a_regex_is_added_last() -> None:
    assert choose_checks(['{"a": 1}'], schema=True) == [CheckKind.JSON_SCHEMA, CheckKind.JSON_KEYS]
    assert choose_checks(["free text here"], regex=r"\d+") == [CheckKind.NORMALISED, CheckKind.EXACT, CheckKind.REGEX]


def test_labels_are_short_few_and_repeated() -> None:
    assert is_label_set(["spam", "ham", "spam", "ham"])
    assert not is_label_set(["one", "two", "three", "four"]), "every label once: free answers"
    assert not is_label_set(["a very long answer that is no label"] * 2 + ["ok", "ok"])


def test_json_answers_are_right_with_the_same_keys_and_kind() -> None:
    reference = '{"name": "Ada", "age": 36}'
    assert passes(CheckKind.JSON_KEYS, reference, '{"age": 1, "name": "x"}')
    assert passes(CheckKind.JSON_KEYS, reference, '```json\n{"age": 1, "name": "x"}\n```')
    assert not passes(CheckKind.JSON_KEYS, reference, '{"name": "Ada"}'), "a key missing"
    assert not passes(CheckKind.JSON_KEYS, reference, "name: Ada, age: 36"), "not JSON"
    assert not passes(CheckKind.JSON_KEYS, reference, '[{"name": "Ada", "age": 36}]'), "a list, not an object"


def test_a_regex_is_searched_in_the_answer_and_a_broken_one_is_named() -> None:
    assert passes(CheckKind.REGEX, "", "Order #4521 shipped", regex=r"#\d{4}\b")
    assert not passes(CheckKind.REGEX, "", "Order shipped", regex=r"#\d{4}\b")
    assert regex_problem(r"#\d{4}") == ""
    assert "does not compile" in regex_problem("(unclosed") and "leave it out" in regex_problem("(unclosed")


def test_the_mcnemar_p_value_is_the_exact_two_sided_binomial_tail() -> None:
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(4, 0) == 2 / 16
    assert mcnemar_p(6, 0) == pytest.approx(2 / 64)
    assert mcnemar_p(8, 2) == pytest.approx(2 * sum(comb(10, k) for k in range(3)) / 2**10)
    assert mcnemar_p(5, 5) == 1.0, "capped at 1"
    assert mcnemar_p(2, 8) == mcnemar_p(8, 2), "two-sided"


def test_the_verdict_lists_fixed_and_broken_rows_with_both_answers() -> None:
    checks = [CheckKind.NORMALISED, CheckKind.EXACT]
    rows = [
        _row(1, "Paris", "London", "Paris.", checks),  # fixed (normalised), still not exact
        _row(2, "Rome", "Rome", "Milan", checks),  # broken
        _row(3, "Oslo", "Oslo", "Oslo", checks),  # both right
        _row(4, "Bern", "Zurich", "Geneva", checks),  # both wrong
    ]
    verdict = judge(rows, checks)
    assert verdict.deciding is CheckKind.NORMALISED
    assert [(s.kind, s.base_right, s.tuned_right, s.rows) for s in verdict.scores] == [
        (CheckKind.NORMALISED, 2, 2, 4),
        (CheckKind.EXACT, 2, 1, 4),
    ]
    assert [(r.line, r.base_answer, r.tuned_answer) for r in verdict.fixed] == [(1, "London", "Paris.")]
    assert [(r.line, r.base_answer, r.tuned_answer) for r in verdict.broke] == [(2, "Rome", "Milan")]
    assert verdict.outcome is Outcome.UNCLEAR and verdict.p_value == 1.0


def test_enough_one_sided_flips_make_a_clear_verdict_either_way() -> None:
    checks = [CheckKind.LABEL]
    better = [_row(i, "spam", "ham", "spam", checks) for i in range(6)]
    assert judge(better, checks).outcome is Outcome.BETTER
    worse = [_row(i, "spam", "spam", "ham", checks) for i in range(6)]
    assert judge(worse, checks).outcome is Outcome.WORSE
    assert judge(better[:5], checks).outcome is Outcome.UNCLEAR, "5 of 5 could still be luck (p = 0.0625)"


def test_a_label_task_is_scored_per_label() -> None:
    checks = [CheckKind.LABEL]
    rows = [
        _row(1, "spam", "ham", "spam", checks),
        _row(2, "spam", "spam", "spam", checks),
        _row(3, "Ham.", "spam", "ham", checks),
    ]
    labels = {x.label: (x.rows, x.base_right, x.tuned_right) for x in judge(rows, checks).labels}
    assert labels == {"spam": (2, 1, 2), "ham": (1, 0, 1)}


def test_no_rows_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one scored row"):
        judge([], [CheckKind.EXACT])
