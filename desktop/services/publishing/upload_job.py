"""Child-process job: publish files to a Hugging Face Hub repo with ``huggingface_hub``.

Run as ``python upload_job.py '<json>'`` where the JSON names the repo, its visibility, the files (local path and
path in the repo), small texts to add (the model card; ``THIS_REPO`` in them becomes the repo's id) and the commit
message; the token is the first line of stdin, never an argument or a variable.
It imports only the standard library and ``huggingface_hub``, so it runs by path with the local tools' Python. Each
large file is sent on its own (Git LFS; a rerun sends only what the Hub lacks), then one commit adds every file.
Output: ``PROGRESS <json>`` lines as it goes, and ``RESULT <json>`` (``repo``, ``url``, ``commit``) at the end, or
``ERROR <json>`` (``kind``, the exception's class, and ``message``) with exit code 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROGRESS_PREFIX = "PROGRESS "
RESULT_PREFIX = "RESULT "
ERROR_PREFIX = "ERROR "


def say(prefix: str, **fields: object) -> None:
    """One machine-readable line for the app."""
    print(prefix + json.dumps(fields), flush=True)


def publish(request: dict[str, object], token: str) -> dict[str, str]:
    """Creates the repo (kept if it exists), sends the large files one by one, commits everything."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(token=token)
    repo = str(request["repo"])
    if "/" not in repo:
        repo = f"{api.whoami()['name']}/{repo}"
    say(PROGRESS_PREFIX, text=f"creating {repo}", fraction=None)
    url = str(api.create_repo(repo, private=bool(request["private"]), exist_ok=True))
    files = [(str(local), str(in_repo)) for local, in_repo in request["files"]]  # type: ignore[attr-defined]
    total = sum(Path(local).stat().st_size for local, _ in files) or 1
    sent = 0
    texts: dict[str, str] = request["texts"]  # type: ignore[assignment]
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=text.replace("THIS_REPO", repo).encode("utf-8"))
        for name, text in texts.items()
    ]
    for number, (local, in_repo) in enumerate(files, start=1):
        # one file's upload reports nothing until it ends, so the bar shows activity, the words how far it is
        share = f"{sent / total:.0%} of {_size(total)} sent"
        say(PROGRESS_PREFIX, text=f"uploading {in_repo} (file {number} of {len(files)}; {share})", fraction=None)
        operation = CommitOperationAdd(path_in_repo=in_repo, path_or_fileobj=local)
        api.preupload_lfs_files(repo, additions=[operation])
        operations.append(operation)
        sent += Path(local).stat().st_size
    say(PROGRESS_PREFIX, text=f"committing {len(operations)} files", fraction=1.0)
    info = api.create_commit(repo, operations=operations, commit_message=str(request["message"]))
    return {"repo": repo, "url": url, "commit": str(info.oid)}


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def main() -> None:
    """Reads the request and the token, publishes, prints the result."""
    request = json.loads(sys.argv[1])
    token = sys.stdin.readline().strip()
    try:
        result = publish(request, token)
    except Exception as exc:  # noqa: BLE001 - any failure becomes one line the app words; a traceback helps no user
        say(ERROR_PREFIX, kind=type(exc).__name__, message=" ".join(str(exc).split())[:800])
        sys.exit(1)
    say(RESULT_PREFIX, **result)


if __name__ == "__main__":
    main()
