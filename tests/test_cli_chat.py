"""``rentune chat`` as a user runs it: a separate process, a real GGUF, stdout holding only the answers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from desktop.cli.app import main
from tests.fixtures.smollm2 import SmolLM2
from tests.local.test_chat import direct_answer

ROOT = Path(__file__).resolve().parents[1]


def rentune_chat(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "desktop", "chat", *args]
    return subprocess.run(command, cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=240, check=False)


def test_prompt_prints_only_what_llama_cpp_answers(smollm2: SmolLM2) -> None:
    question = "What is the capital of France?"
    done = rentune_chat(str(smollm2.gguf), "--prompt", question, "--temperature", "0", "--max-tokens", "16")

    expected = direct_answer(smollm2.gguf, [{"role": "user", "content": question}], 16)
    assert done.returncode == 0, done.stderr
    assert expected.strip()
    assert done.stdout == expected + "\n"
    assert done.stderr == ""


def test_interactive_chat_keeps_history_resets_and_exits(smollm2: SmolLM2) -> None:
    done = rentune_chat(
        str(smollm2.gguf), "--temperature", "0", "--max-tokens", "12", stdin="Hi!\nWho are you?\n/reset\nHi!\n/exit\n"
    )

    first = direct_answer(smollm2.gguf, [{"role": "user", "content": "Hi!"}], 12)
    history = [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "Who are you?"},
    ]
    second = direct_answer(smollm2.gguf, history, 12)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"> {first}\n> {second}\n> > {first}\n> "
    assert "(conversation cleared)" in done.stderr


def test_save_to_adds_the_chat_to_a_file_of_training_chats(smollm2: SmolLM2, tmp_path: Path) -> None:
    target = tmp_path / "good.jsonl"
    for _ in range(2):
        done = rentune_chat(
            str(smollm2.gguf), "--prompt", "Hi!", "--temperature", "0", "--max-tokens", "6", "--save-to", str(target)
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == f"Added this chat to {target} (one chat per line).\n"
    answer = direct_answer(smollm2.gguf, [{"role": "user", "content": "Hi!"}], 6)
    lines = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    assert lines == [{"messages": [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": answer}]}] * 2


def test_end_of_input_ends_the_chat(smollm2: SmolLM2) -> None:
    done = rentune_chat(str(smollm2.gguf), "--temperature", "0", "--max-tokens", "4", stdin="")
    assert done.returncode == 0
    assert done.stdout == "> "


def test_ctrl_c_stops_the_answer_not_the_chat(smollm2: SmolLM2) -> None:
    chat = ["chat", str(smollm2.gguf), "--temperature", "0", "--max-tokens", "2000"]
    # as at a terminal: a suite started in the background (`make test &`) hands its children an ignored SIGINT
    start = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = ['rentune', *{chat!r}]; runpy.run_module('desktop', run_name='__main__', alter_sys=True)"
    )
    command = [sys.executable, "-c", start]
    process = subprocess.Popen(
        command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        assert process.stdout.read(2) == "> "
        # a long answer (greedy, it runs to --max-tokens: about 2,000 characters): a short one may end on its own
        # before the signal, and Ctrl-C at "> " quits instead of stopping an answer
        process.stdin.write("Write the numbers from 1 to 1000 separated by commas.\n")
        process.stdin.flush()
        process.stdout.read(20)  # the answer is streaming
        process.send_signal(signal.SIGINT)
        out, err = process.communicate("/exit\n", timeout=120)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, err
    assert "(answer stopped)" in err
    assert out.endswith("\n> ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.gguf"], "missing.gguf does not exist"),
        (["x.gguf"], "x.gguf is not a GGUF file"),
        (["MODEL", "--engine", "mlx"], "--engine mlx needs an MLX model folder"),
        (["MODEL", "--max-tokens", "0"], "--max-tokens must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str],
    message: str,
    smollm2: SmolLM2,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "x.gguf").write_text("hello")
    monkeypatch.chdir(tmp_path)
    argv = ["chat", *(str(smollm2.gguf) if a == "MODEL" else a for a in args), "--prompt", "hi"]

    code = main(argv)

    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert message in captured.err
    assert captured.err.count("\n") == 1
