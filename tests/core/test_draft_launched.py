"""A launched draft stays launched (across a save and a reload) until one of its choices changes."""

from __future__ import annotations

from desktop.core.runs.draft import RunDraft


def test_a_draft_is_launched_until_a_choice_changes() -> None:
    draft = RunDraft(base_model="org/model", train_file="/data/train.jsonl", step="review")
    assert not draft.launched
    draft.mark_launched("20261205-010000-abcd")
    assert draft.launched and draft.launched_run == "20261205-010000-abcd"
    draft.step = "data"  # looking at another page is not a change
    assert draft.launched
    reloaded = RunDraft.model_validate_json(draft.model_dump_json())
    assert reloaded.launched and reloaded.content_digest() == draft.content_digest()
    reloaded.budget_usd = 4.0
    assert not reloaded.launched  # a changed draft launches another run
    reloaded.budget_usd = 0.0
    assert reloaded.launched  # back to the launched choices: the same run, not launched twice


def test_a_draft_saved_before_launches_were_recorded_is_not_launched() -> None:
    old = RunDraft.model_validate({"base_model": "org/model", "step": "review"})
    assert not old.launched and old.launched_run == ""
