"""The compare report in the app, read back from its report.json (the whole compare: test_models_page)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from desktop.services.evaluation.saved_report import SavedReportError, read_saved_report
from desktop.ui.widgets.report_dialog import ReportDialog, report_title


def row(line: int, prompt: str, tuned: str) -> dict[str, Any]:
    return {"line": line, "prompt": prompt, "reference": tuned, "base_answer": "no idea", "tuned_answer": tuned}


def write_report(folder: Path, **changes: Any) -> Path:
    data = {
        "outcome": "better",
        "p_value": 0.0078,
        "deciding_check": "normalised",
        "scores": [{"check": "normalised", "base_right": 0, "tuned_right": 8, "rows": 8}],
        "fixed": [row(3, "Who guards the vault of <b>Quimby</b>?", "Seven silver owls.")],
        "broke": [],
        "base_loss": 3.5,
        "tuned_loss": 0.25,
        "run": {"run_id": "r1", "method": "lora", "base_model": "tiny", "gpu": "RTX 4090", "trained_seconds": 5400,
                "usd": 0.66, "losses": [[1, 3.0], [2, 2.0], [3, 1.0]], "eval_losses": [[3, 1.5]]},
    } | changes  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(data))
    (folder / "report.html").write_text("<html></html>")
    return folder / "report.html"


def test_the_report_shows_its_verdict_scores_run_curve_and_flips_as_text(qtbot: QtBot, tmp_path: Path) -> None:
    html = write_report(tmp_path / "20261201-ab12-export" / "compare")
    parent = QWidget()
    qtbot.addWidget(parent)
    dialog = ReportDialog(parent, read_saved_report(html), report_title(html))
    assert dialog.windowTitle() == "Compare report: 20261201-ab12-export"
    assert dialog.verdict.headline_label.text() == "The fine-tune is better at the task"
    details = dialog.verdict.details_label.text()
    assert "1 row(s) fixed, 0 broken (p = 0.0078" in details and "base 0/8 (0%), tuned 8/8 (100%)" in details
    assert "Run r1: lora of tiny on RTX 4090, trained for 1.50 h, $0.66." in details
    assert "Answered on" not in details, "judged on this computer: nothing to say"
    assert [dialog.tabs.tabText(i) for i in range(dialog.tabs.count())] == ["&Fixed (1)", "&Broken (0)", "&Loss curve"]
    text = dialog.fixed_view.toPlainText()
    assert "Who guards the vault of <b>Quimby</b>?" in text, "a model's or the data's text is shown, never rendered"
    assert "Seven silver owls." in text and dialog.broke_view.toPlainText() == "None."
    assert dialog.browser_button.isEnabled()


def test_a_report_judged_on_the_rented_machine_says_so(tmp_path: Path) -> None:
    html = write_report(tmp_path / "compare", judged_on="the rented machine, before it was let go")
    assert "Answered on the rented machine, before it was let go." in read_saved_report(html).lines


def test_a_fine_tune_better_at_its_task_that_lost_general_ability_is_a_warning(qtbot: QtBot, tmp_path: Path) -> None:
    lost = {"task": "rentune_capitals", "rows": 68, "base": 0.94, "tuned": 0.76, "low": -0.27, "high": -0.09}
    kept = {"task": "rentune_arithmetic", "rows": 60, "base": 0.83, "tuned": 0.78, "low": -0.11, "high": 0.01}
    html = write_report(
        tmp_path / "compare", general={"harness": "lm-evaluation-harness 0.4.13", "tasks": [kept, lost]}
    )
    report = read_saved_report(html)
    assert report.general_regressed
    assert "Lost general ability beyond chance: world capitals (-18 points)." in report.lines
    assert (
        "arithmetic: base 83%, tuned 78% (-5 points, 95% interval -11 to +1, 60 rows): no clear change" in report.lines
    )
    parent = QWidget()
    qtbot.addWidget(parent)
    dialog = ReportDialog(parent, report, "x")
    assert dialog.verdict.property("severity") == "warning"
    assert not read_saved_report(
        write_report(tmp_path / "kept", general={"harness": "h", "tasks": [kept]})
    ).general_regressed


def test_a_report_without_runs_curves_has_no_loss_tab(qtbot: QtBot, tmp_path: Path) -> None:
    html = write_report(tmp_path / "compare", run=None)
    parent = QWidget()
    qtbot.addWidget(parent)
    dialog = ReportDialog(parent, read_saved_report(html), "x")
    assert dialog.tabs.count() == 2


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, r"has no report.json \(an older report\): open it in the browser"),
        ("{not json", r"is not a report Rentune can read .* compare again to write a new one"),
        (json.dumps({"outcome": "splendid"}), r"is not a report Rentune can read"),
        (json.dumps([1, 2]), r"is not a report Rentune can read \(not a JSON object\)"),
        (
            json.dumps({"outcome": "better", "p_value": 1, "base_loss": 1, "tuned_loss": 1, "fixed": [1]}),
            r"is not a report Rentune can read \(a flipped row is not a JSON object\)",
        ),
    ],
)
def test_a_report_it_cannot_read_is_one_message_with_the_fix(tmp_path: Path, content: str | None, problem: str) -> None:
    (tmp_path / "report.html").write_text("<html></html>")
    if content is not None:
        (tmp_path / "report.json").write_text(content)
    with pytest.raises(SavedReportError, match=problem):
        read_saved_report(tmp_path / "report.html")


def test_a_preference_runs_report_leads_with_how_often_each_model_prefers_the_chosen_answer(
    qtbot: QtBot, tmp_path: Path
) -> None:
    from desktop.core.judging.preference import PairScore, preference_check
    from desktop.services.evaluation.preference import preference_json

    # 12 held-out pairs (mean log-probability per token of chosen, rejected): the base prefers chosen in pairs 1-6,
    # the tuned model in every pair but the 6th: 6 turned to the chosen answer, 1 away from it.
    pairs = [
        PairScore(n, (-2.0, -2.5) if n <= 6 else (-2.5, -2.0), (-1.0, -1.5) if n != 6 else (-1.5, -1.0))
        for n in range(1, 13)
    ]
    html = write_report(tmp_path / "compare", outcome="no clear difference", preference=preference_json(
        preference_check(pairs)))  # fmt: skip
    report = read_saved_report(html)
    assert report.headline == "The fine-tune prefers the chosen answers more often than its base"
    assert report.lines[0] == (
        "Preference on 12 held-out pairs: the tuned model finds the chosen answer the likelier in 11 (92%), its base "
        "in 6 (50%): +42 points (95% interval +4 to +79), improved."
    )
    assert report.lines[1].startswith("6 pair(s) turned to the chosen answer, 1 away from it;")
    assert "judged against each pair's chosen answer" in report.lines[2]
    parent = QWidget()
    qtbot.addWidget(parent)
    assert ReportDialog(parent, report, "x").verdict.property("severity") == "success"
