"""``rentune chat``: ask a local GGUF or MLX model once (``--prompt``), or chat with it in the terminal.

With ``--prompt`` only the answer goes to stdout. In the terminal, ``/reset`` forgets the conversation, ``/exit`` or
end of input leaves, and Ctrl-C during an answer stops that answer only. ``--save-to FILE.jsonl`` adds the chat, when
it ends, to a file of training chats (the format the data step reads), as the app's "Save as training data" does.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from desktop.cli.errors import EXIT_OK, CliError
from desktop.services.local.chat import ChatModel, Conversation, open_chat
from desktop.services.local.chat_history import export_training_jsonl
from desktop.services.local.common import LocalToolError

_HELP = "Type a message and press Enter; /reset forgets the conversation, /exit leaves, Ctrl-C stops an answer."


def run_chat(args: argparse.Namespace) -> int:
    """Runs ``rentune chat``.

    Returns:
        0 when the answer was given or the chat ended.

    Raises:
        CliError: MODEL or --lora is missing or unusable (exit 2), or generating failed (exit 1).
    """
    if args.max_tokens < 1:
        raise CliError("--max-tokens must be at least 1")
    if args.temperature < 0:
        raise CliError("--temperature must be 0 (greedy) or more")
    with asyncio.Runner() as runner:
        try:
            model = runner.run(open_chat(args.model, engine=args.engine, lora=args.lora))
        except LocalToolError as exc:
            raise CliError(str(exc)) from exc
        try:
            conversation = Conversation(system=args.system)
            if args.prompt is not None:
                runner.run(_say(model, conversation, args.prompt, args))
            else:
                _interactive(runner, model, conversation, args)
        finally:
            runner.run(model.close())
    if args.save_to is not None:
        _save(conversation, args.save_to)
    return EXIT_OK


def _save(conversation: Conversation, target: Path) -> None:
    """Adds the chat to the training file ``target`` and says so on stderr."""
    try:
        export_training_jsonl(conversation, target)
    except ValueError as exc:
        raise CliError(f"nothing saved to {target}: {exc}", exit_code=1) from exc
    except OSError as exc:
        raise CliError(f"could not write {target} ({exc.strerror or exc}); choose another file", exit_code=1) from exc
    print(f"Added this chat to {target} (one chat per line).", file=sys.stderr)


async def _say(model: ChatModel, conversation: Conversation, question: str, args: argparse.Namespace) -> None:
    """Streams the answer to stdout as it comes and records the exchange once it is complete."""
    pieces: list[str] = []
    try:
        async for piece in model.stream(
            conversation.with_question(question), temperature=args.temperature, max_tokens=args.max_tokens
        ):
            pieces.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
    except LocalToolError as exc:
        raise CliError(str(exc), exit_code=1) from exc
    finally:
        sys.stdout.write("\n")
        sys.stdout.flush()
    conversation.record(question, "".join(pieces))


def _interactive(
    runner: asyncio.Runner, model: ChatModel, conversation: Conversation, args: argparse.Namespace
) -> None:
    """Reads a message per line until /exit, end of input or Ctrl-C at the prompt."""
    print(f"Chatting with {args.model.name} ({model.engine}). {_HELP}", file=sys.stderr)
    while True:
        try:
            line = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        if line == "/exit":
            return
        if line == "/reset":
            conversation.reset()
            print("(conversation cleared)", file=sys.stderr)
        elif line:
            try:
                # asyncio.Runner turns Ctrl-C into cancelling this answer, then raises KeyboardInterrupt here
                runner.run(_say(model, conversation, line, args))
            except KeyboardInterrupt:
                print("(answer stopped)", file=sys.stderr)
