"""The arguments of every ``rentune`` command, in one place: what a user can type, and its defaults."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from desktop import __version__
from desktop.cli.errors import EXIT_USAGE, redacted
from desktop.core.sizing.plan import NODE_COUNTS
from desktop.core.sizing.setup import DEFAULT_SETUP, Method, Objective, Strategy, Targets
from desktop.services.providers.base import ProviderName
from trainer_payload.protocol import PROTOCOL_VERSION


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: the problem, and where the options are listed."""

    def error(self, message: str) -> NoReturn:
        """Prints ``PROG: error: MESSAGE; see PROG --help`` (secrets masked) and exits with 2."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {redacted(message)}; see {self.prog} --help\n")


def _size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d{3,5})x(\d{3,5})", text)
    if not match:
        raise argparse.ArgumentTypeError(f"size {text!r} must look like 1280x800")
    return int(match[1]), int(match[2])


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"scale {text!r} must be a number such as 1 or 2") from None
    if not 0.5 <= value <= 4:
        raise argparse.ArgumentTypeError(f"scale {value:g} must be between 0.5 and 4")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Returns the parser of the ``rentune`` command line."""
    parser: argparse.ArgumentParser = _Parser(
        prog="rentune",
        description="Fine-tune LLMs on rented GPUs. Without a command, opens the desktop app.",
    )
    parser.add_argument(
        "--version", action="version", version=f"rentune {__version__} (payload protocol {PROTOCOL_VERSION})"
    )
    parser.add_argument("--screenshot", metavar="FILE", type=Path, help="render the window offscreen to a PNG, exit")
    parser.add_argument("--page", metavar="NAME", help="the page to open (or to render with --screenshot)")
    parser.add_argument("--size", type=_size, default=(1280, 800), help="window size, e.g. 1280x800")
    parser.add_argument("--scale", type=_scale, default=1.0, help="UI scale factor, e.g. 2 for 200%%")
    parser.add_argument("--theme", choices=["light", "dark"], help="draw the app light or dark, whatever Settings say")
    parser.add_argument("--startup-probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--minimized", action="store_true", help="start in the menu bar or tray without the window (used at login)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("gui", help="open the desktop app (the default)")
    doctor = commands.add_parser("doctor", help="check this computer: Python, keyring, data folder, local tools")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    _add_plan_parser(commands)
    _add_data_parser(commands)
    _add_run_parsers(commands)
    _add_trial_parser(commands)
    _add_serve_parser(commands)
    _add_rent_parsers(commands)
    _add_money_parsers(commands)
    _add_storage_parser(commands)
    _add_local_parsers(commands)
    return parser


def _add_storage_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    storage = commands.add_parser(
        "storage",
        help="your bucket (S3, R2, B2, Wasabi, MinIO): set it up, show it, check it",
        description="The bucket Rentune keeps data and checkpoints in, near the GPUs. Its keys are in the keyring "
        "(rentune keys set bucket-key-id and bucket-secret, or RENTUNE_BUCKET_KEY_ID and RENTUNE_BUCKET_SECRET).",
    )
    actions = storage.add_subparsers(dest="storage_command", metavar="ACTION", required=True)
    setting = actions.add_parser("set", help="save the bucket's address, endpoint and region (the Storage settings)")
    setting.add_argument("url", metavar="s3://BUCKET/PREFIX", help="the bucket, and a prefix inside it")
    setting.add_argument("--endpoint", default="", help="the store's S3 endpoint (default: AWS)")
    setting.add_argument("--region", default="us-east-1", help="the bucket's region (R2: auto; default us-east-1)")
    setting.add_argument("--keep", type=int, default=3, metavar="N", help="whole checkpoints kept per run (default 3)")
    setting.add_argument(
        "--price", type=float, default=0.023, metavar="USD", help="the store's price per GB-month (default 0.023)"
    )
    setting.add_argument(
        "--full-checkpoints-home",
        action="store_true",
        help="bring a full fine-tune's checkpoints home too (by default they stay in the bucket; adapters come home)",
    )
    actions.add_parser("show", help="the bucket as set up, and where its keys come from (never the keys)")
    check = actions.add_parser("check", help="write, read back and delete a test object in the bucket")
    check.add_argument("--json", action="store_true", help="print the result as JSON")
    listing = actions.add_parser("ls", help="each run's checkpoints in the bucket: step, size, whole or not")
    listing.add_argument("run", nargs="?", metavar="RUN_ID", help="one run only")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    usage = actions.add_parser("du", help="what is stored in the bucket and what it costs a month")
    usage.add_argument("--json", action="store_true", help="print the totals as JSON")
    prune = actions.add_parser("prune", help="keep each run's newest whole checkpoints in the bucket, delete the rest")
    prune.add_argument("--keep", type=int, metavar="N", help="how many per run (default: the Storage settings', 3)")
    prune.add_argument("--run", metavar="RUN_ID", help="one run only")
    remove = actions.add_parser("rm", help="delete every checkpoint of a run from the bucket (its data stays)")
    remove.add_argument("run", metavar="RUN_ID", help="the run whose objects go")


def _add_target_options(parser: argparse.ArgumentParser, *, several: bool = False) -> None:
    if several:
        parser.add_argument(
            "--target",
            action="append",
            help="ssh://user@host:port of the machine to move to; a run on several: once per machine, the head first",
        )
    else:
        parser.add_argument("--target", help="ssh://user@host:port (overrides [target] ssh)")
    parser.add_argument("--identity", type=Path, help="private key to log in with (overrides [target] identity)")
    parser.add_argument("--python", help="interpreter on the machine (overrides [target] python)")


def _add_run_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = commands.add_parser("run", help="train SPEC.toml on an SSH machine and bring the adapter home")
    run.add_argument("spec", type=Path, help="the run spec (see resources/examples/SPEC.toml)")
    _add_target_options(run)
    run.add_argument("--detach", action="store_true", help="keep driving the run in the background and return")
    run.add_argument(
        "--on-overrun",
        choices=("ask", "continue", "stop"),
        help="when the first measured steps put the run over its budget or 25 %% over its estimate: ask (the "
        "default in a terminal; the trainer waits paused, at most 10 minutes), continue, or stop with a checkpoint "
        "(the default without a terminal)",
    )
    runs = commands.add_parser("runs", help="list runs")
    runs.add_argument("--json", action="store_true")
    for name, text in (
        ("status", "show a run's state, history and last events"),
        ("logs", "print a run's events"),
        ("stop", "save a checkpoint, stop training, cancel the run (a serving run: serving ends, the run finishes)"),
        ("pull", "bring the newest checkpoint home now"),
        ("resume", "continue a run (reattach, or move it to another machine with --target)"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("run_id", metavar="RUN", help="run id (a unique prefix is enough)")
        if name == "logs":
            command.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
            command.add_argument("--payload", action="store_true", help="the trainer's own log from the machine")
        if name == "status":
            command.add_argument("--json", action="store_true")
        if name == "resume":
            _add_target_options(command, several=True)


def _add_money_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    costs = commands.add_parser("costs", help="what rented machines cost: each rental, totals, machines still billing")
    costs.add_argument("--json", action="store_true", help="print one JSON object (dollars rounded to cents)")
    costs.add_argument(
        "--run",
        metavar="RUN",
        help="one run's bill by phase (waiting for the machine, setup, training, checkpoint transfers while "
        "training, waiting on you, pulling home, export, teardown) and its effective training hour",
    )
    _add_rent_or_buy_flags(costs)
    keys = commands.add_parser("keys", help="API keys and tokens in the keyring: set (checked first), list, delete")
    actions = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    providers = [name.value for name in ProviderName] + ["huggingface", "wandb", "bucket-key-id", "bucket-secret"]
    for name, text in (
        (
            "set",
            "store a cloud's API key (checked with the provider first), a Hugging Face token, a W&B key or the "
            "bucket's keys (prompts, or reads one line of stdin)",
        ),
        ("delete", "remove a key or token from the keyring"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument(
            "provider", type=str.lower, choices=providers, metavar="PROVIDER", help=" | ".join(providers)
        )
    listing = actions.add_parser("list", help="where each key comes from (never the key itself)")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")


def _add_rent_or_buy_flags(costs: argparse.ArgumentParser) -> None:
    """``--rent-or-buy`` and the figures it takes in place of the saved ones (the Costs page's)."""
    costs.add_argument(
        "--rent-or-buy",
        action="store_true",
        help="a year of renting as you rent (the last 90 days) against owning a card, speed-adjusted, and the "
        "break-even hours",
    )
    group = costs.add_argument_group("rent or buy (default: what the Costs page last used)")
    for flag, metavar, text in (
        ("--card", "ID", "rtx3090, rtx4090, rtx5090, rtx-a6000, h100-pcie; this-computer after a trial"),
        ("--hours", "H", "hours of rented training a year (default: the last 90 days, extrapolated)"),
        ("--price", "USD", "what the card costs"),
        ("--watts", "W", "what the computer draws while it trains"),
        ("--kwh", "USD", "electricity price per kWh"),
        ("--resale", "PCT", "what the card sells for after --years, in percent of its price"),
        ("--years", "N", "how long the card is kept"),
        ("--rent", "GPU", "compare against this GPU type at its list price (h100-sxm, a100-80gb...)"),
    ):
        kind: Callable[[str], object] = str.lower if flag in ("--card", "--rent") else float
        group.add_argument(flag, type=kind, metavar=metavar, help=text)


def _columns(text: str) -> dict[str, str]:
    mapping = {}
    for part in text.split(","):
        role, _, column = part.partition("=")
        if role.strip() not in {"system", "user", "assistant"} or not column.strip():
            raise argparse.ArgumentTypeError(
                f"--columns {text!r}: use ROLE=COLUMN pairs, e.g. user=question,"
                "assistant=answer (roles: system, user, assistant)"
            )
        mapping[role.strip()] = column.strip()
    if not {"user", "assistant"} <= set(mapping):
        raise argparse.ArgumentTypeError("--columns needs at least user=COLUMN and assistant=COLUMN")
    return mapping


def _add_data_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    data = commands.add_parser("data", help="check and prepare a chat dataset on this computer")
    actions = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    for name, text in (
        ("check", "report problems with line numbers, and token counts (exit 0 clean, 1 errors, 2 unusable)"),
        ("prepare", "drop bad rows and duplicates, split train/eval, write messages JSONL + manifest"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument("file", type=Path, help="JSONL, CSV or Parquet file")
        action.add_argument("--model", help="count tokens with this model's tokenizer and chat template")
        action.add_argument(
            "--seq-len",
            type=int,
            default=DEFAULT_SETUP.seq_len,
            help=f"training sequence length (default {DEFAULT_SETUP.seq_len})",
        )
        action.add_argument("--columns", type=_columns, help="map table columns to roles: user=COL,assistant=COL")
        if name == "check":
            action.add_argument("--json", action="store_true", help="print the report as JSON")
        else:
            action.add_argument("--out", type=Path, required=True, help="folder for train.jsonl, eval.jsonl, manifest")
            action.add_argument("--eval-fraction", type=float, default=0.05, help="share held out (default 0.05)")
            action.add_argument("--seed", type=int, default=42, help="split seed (default 42)")


def _add_plan_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = commands.add_parser(
        "plan",
        help="size a fine-tune: memory per GPU, GPU options, hours and dollars",
        description="Size a fine-tune before renting. Defaults follow proven settings: QLoRA, r=16, alpha=32, all "
        "linear layers, seq 2048, micro-batch 2, grad-accum 4, checkpointing on, 3 epochs.",
    )
    _add_sizing_flags(plan)
    plan.add_argument("--list-models", action="store_true", help="list the bundled model catalog and exit")
    plan.add_argument("--gpu", help="only this GPU type (e.g. h100-sxm, 'RTX 4090')")
    plan.add_argument("--gpus", type=int, help="only this many GPUs")
    plan.add_argument("--strategy", choices=[s.value for s in Strategy], help="multi-GPU strategy")
    plan.add_argument(
        "--max-nodes",
        type=int,
        default=NODE_COUNTS[-1],
        metavar="N",
        help=f"when one machine of 8 GPUs cannot train it, propose up to N machines (default {NODE_COUNTS[-1]})",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as one JSON object")


def _add_sizing_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that say what is trained and how (``plan`` and ``offers``)."""
    parser.add_argument("--model", help="catalog name, Hub id (org/name), model folder or config.json")
    parser.add_argument("--method", choices=[m.value for m in Method], default=Method.QLORA.value)
    parser.add_argument(
        "--objective",
        choices=[o.value for o in Objective],
        default=Objective.SFT.value,
        help="sft (chats), dpo or orpo (preference pairs: both answers and, for DPO, a reference model counted), "
        "cpt (raw text)",
    )
    parser.add_argument("--seq-len", type=int, default=DEFAULT_SETUP.seq_len)
    parser.add_argument("--micro-batch", type=int, default=DEFAULT_SETUP.micro_batch)
    parser.add_argument("--grad-accum", type=int, default=DEFAULT_SETUP.grad_accum)
    parser.add_argument("--lora-r", type=int, default=DEFAULT_SETUP.lora_r)
    parser.add_argument("--targets", choices=[Targets.ALL_LINEAR.value, Targets.ATTENTION.value], default="all-linear")
    parser.add_argument("--no-grad-ckpt", action="store_true", help="turn gradient checkpointing off")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--tokens", type=int, help="training tokens per epoch, both answers of every pair (default 15,000,000)"
    )
    source.add_argument("--dataset", type=Path, help="JSONL chat or pair dataset to count tokens from")
    parser.add_argument("--epochs", type=float, default=3.0)


def _add_rent_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    offers = commands.add_parser(
        "offers",
        help="live GPU offers of every provider, cheapest first; with --model, what fits and what it costs",
        description="Ask RunPod, Vast.ai and Lambda for GPUs now. With --model (and the plan's flags), each offer "
        "says whether the fine-tune fits, its hours and its total at the offer's price.",
    )
    offers.add_argument("--provider", choices=["runpod", "vast", "lambda", "all"], default="all")
    offers.add_argument("--min-vram", type=float, metavar="GB", help="memory per GPU, at least")
    offers.add_argument("--gpus", type=int, metavar="N", help="GPUs per machine")
    offers.add_argument(
        "--nodes", type=int, default=1, metavar="N", help="machines rented together as one cluster (RunPod), N of them"
    )
    offers.add_argument("--max-price", type=float, metavar="USD", help="the whole machine's $/h, at most")
    offers.add_argument("--spot", action="store_true", help="interruptible offers instead of on-demand ones")
    _add_sizing_flags(offers)
    offers.add_argument("--json", action="store_true", help="print the offers as a JSON list")
    machines = commands.add_parser("machines", help="every machine at every provider; find and stop orphans")
    machines.add_argument("--json", action="store_true", help="print the machines as a JSON list")
    machines.add_argument(
        "--stop-orphans", action="store_true", help="terminate this computer's rentune-* machines no live run owns"
    )
    machines.add_argument(
        "--include-other-computers",
        action="store_true",
        help="with --stop-orphans: also terminate machines another computer's Rentune rented on the same account",
    )


#: Quantisation types ``rentune export --gguf`` accepts (llama.cpp's names).
GGUF_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16")


def _gguf_type(text: str) -> str:
    wanted = text.upper()
    if wanted not in GGUF_TYPES:
        raise argparse.ArgumentTypeError(f"GGUF type {text!r} is not one of {', '.join(GGUF_TYPES)}")
    return wanted


def _add_local_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_export_parser(commands)
    _add_chat_parser(commands)
    _add_eval_parser(commands)
    _add_publish_parser(commands)
    _add_tools_parser(commands)


def _add_tools_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tools = commands.add_parser(
        "tools",
        help="the local tools (torch, transformers, peft, llama.cpp) for export and chat: install, status, remove",
        description="Rentune installs the local tools into a private environment under its data folder, from a "
        "Python of its own version; an interrupted install is finished by running install again.",
    )
    actions = tools.add_subparsers(dest="tools_command", metavar="ACTION", required=True)
    actions.add_parser("install", help="install the pinned local tools (or finish an interrupted install)")
    status = actions.add_parser("status", help="what is installed and how big it is")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    actions.add_parser("remove", help="delete the local tools and free their space")
    updates = commands.add_parser(
        "update-check", help="say whether a newer Rentune is released (nothing is downloaded)"
    )
    updates.add_argument("--json", action="store_true", help="print current, newest, newer and url as JSON")


def _add_export_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    export = commands.add_parser(
        "export",
        help="turn an adapter into models that run here: merged, GGUF, GGUF LoRA, Ollama, MLX",
        description="Checks the adapter against its base first, then writes each output asked for "
        "(all of them when none is named) under --out.",
    )
    export.add_argument("adapter", metavar="ADAPTER_DIR_OR_RUN_ID", help="an adapter folder, or a run id")
    export.add_argument("--base", help="base model: a folder or a Hub id (default: the run's or the adapter's base)")
    export.add_argument("--out", type=Path, help="folder to write into (default: ./ADAPTER-export)")
    export.add_argument("--merge", action="store_true", help="a merged 16-bit safetensors model")
    export.add_argument(
        "--gguf", type=_gguf_type, action="append", metavar="TYPE", help=f"a quantised GGUF ({', '.join(GGUF_TYPES)})"
    )
    export.add_argument("--lora-gguf", action="store_true", help="the adapter as a GGUF LoRA, with the base as GGUF")
    export.add_argument(
        "--base-gguf", action="store_true", help="the base model as GGUF too, to chat with it beside the fine-tune"
    )
    export.add_argument("--ollama", action="store_true", help="an Ollama Modelfile beside the GGUF")
    export.add_argument("--mlx", action="store_true", help="an MLX model folder, checked by generating with it")
    export.add_argument("--json", action="store_true", help="print what was written as JSON")


def _add_chat_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    chat = commands.add_parser("chat", help="chat with a GGUF file or an MLX folder in the terminal")
    chat.add_argument("model", metavar="MODEL", type=Path, help="a .gguf file or an MLX model folder")
    chat.add_argument("--lora", type=Path, metavar="LORA_GGUF", help="a GGUF LoRA to apply (llama.cpp)")
    chat.add_argument("--engine", choices=("llama.cpp", "mlx"), help="default: follows from MODEL")
    chat.add_argument("--prompt", help="ask once, print only the answer, exit")
    chat.add_argument("--system", help="a system message")
    chat.add_argument("--temperature", type=float, default=0.7, help="0 answers greedily (default 0.7)")
    chat.add_argument("--max-tokens", type=int, default=512, help="longest answer in tokens (default 512)")
    chat.add_argument(
        "--save-to", type=Path, metavar="FILE.jsonl", help="add the chat to this file of training chats when it ends"
    )


def _trial_share(text: str) -> float:
    try:
        value = float(text.removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"slice {text!r} must be a percentage such as 1 or 5") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"slice {value:g} % must be above 0 and at most 100")
    return value / 100


def _add_trial_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    trial = commands.add_parser(
        "trial",
        help="a short run on a slice of the data on this computer, before anything is rented",
        description="Trains the run's model on a slice of its data here (MLX on Apple Silicon, the payload on an "
        "NVIDIA GPU or, for small models, the CPU): the loss must fall, the first answers are shown, this "
        "computer's speed and memory are measured, and the adapter is listed on Models like a run's.",
    )
    trial.add_argument("spec", type=Path, metavar="SPEC", help="the run's SPEC.toml (its target is not used)")
    trial.add_argument("--steps", type=int, default=50, metavar="N", help="optimizer steps (default 50)")
    trial.add_argument(
        "--slice", type=_trial_share, default=0.01, metavar="PCT", help="percent of the chats to train on (default 1)"
    )
    trial.add_argument("--on", choices=["mlx", "gpu", "cpu"], help="what trains it (default: the best here)")
    trial.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _add_serve_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="an OpenAI-compatible endpoint on this computer for a GGUF, until Ctrl-C",
        description="Serves a GGUF with llama.cpp's server on 127.0.0.1 (the model's own chat template and stop "
        "token): /v1/chat/completions with streaming, /v1/completions, /v1/models. Prints the address and a request "
        "for curl and for Python's openai client; Ctrl-C stops it and says how many requests it answered.",
    )
    serve.add_argument("model", type=Path, metavar="MODEL.gguf", help="a GGUF file (rentune export --gguf Q4_K_M)")
    serve.add_argument("--port", type=int, metavar="N", help="the port on 127.0.0.1 (default: a free one)")
    serve.add_argument("--lora", type=Path, metavar="LORA.gguf", help="a GGUF LoRA over MODEL (--lora-gguf)")
    serve.add_argument("--context", type=int, default=4096, metavar="N", help="context window (default 4096)")
    board = commands.add_parser(
        "tensorboard",
        help="TensorBoard on this computer for a run's event files, until Ctrl-C",
        description='A run with [tracking] report_to = ["tensorboard"] brings its TensorBoard event files home with '
        "each checkpoint and the adapter; this shows the newest in a local TensorBoard on 127.0.0.1 (the local "
        "tools' TensorBoard).",
    )
    board.add_argument("run", metavar="RUN_ID_OR_FOLDER", help="a run id, or a folder of event files")
    trackio = commands.add_parser(
        "trackio",
        help="trackio's dashboard on this computer for a run's trackio database, until Ctrl-C",
        description='A run with [tracking] report_to = ["trackio"] brings its trackio database home with each '
        "checkpoint and the adapter; this shows the newest in trackio's dashboard on 127.0.0.1 (the local tools' "
        "trackio, shown a copy: the run's files stay as they were sealed).",
    )
    trackio.add_argument("run", metavar="RUN_ID_OR_FOLDER", help="a run id, or a folder holding a trackio database")


def _add_publish_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    publish = commands.add_parser(
        "publish", help="share an adapter (and its exports) on the Hugging Face Hub, private, with a model card"
    )
    publish.add_argument("adapter", metavar="ADAPTER_DIR_OR_RUN_ID", help="an adapter folder, or a run id")
    publish.add_argument("--repo", required=True, metavar="NAME", help="owner/name, or name for your own account")
    publish.add_argument("--public", action="store_true", help="make a new repo public (default: private)")
    publish.add_argument("--exports", action="store_true", help="add the run's GGUF files and merged model")
    publish.add_argument("--add", type=Path, action="append", metavar="PATH", help="add a GGUF file or merged folder")


def _add_eval_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    judge = commands.add_parser(
        "eval",
        aliases=["compare"],
        help="judge base vs fine-tuned on held-out chats: task scores, the rows that flipped, losses, cost",
    )
    judge.add_argument("adapter", metavar="ADAPTER_DIR_OR_RUN_ID", help="an adapter folder, or a run id")
    judge.add_argument("--base", help="base model: a folder or a Hub id (default: the run's or the adapter's base)")
    judge.add_argument("--eval", type=Path, metavar="FILE", help="held-out chat JSONL (default: the run's eval rows)")
    judge.add_argument("--regex", metavar="RE", help="a right answer also matches this regular expression")
    judge.add_argument("--json-schema", type=Path, metavar="FILE", help="a right JSON answer satisfies this schema")
    judge.add_argument("--max-examples", type=int, default=50, metavar="N", help="rows judged at most (default 50)")
    judge.add_argument(
        "--general",
        action="store_true",
        help="also check general ability: lm-evaluation-harness on shipped tasks (arithmetic, capitals), offline",
    )
    judge.add_argument("--out", type=Path, help="folder for the report (default: ./RUN_OR_ADAPTER-eval)")
    judge.add_argument("--json", action="store_true", help="print the report as JSON")
