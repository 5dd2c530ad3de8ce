from __future__ import annotations

import errno

import pytest

from trainer_payload.failures import DataError, classify, hint
from trainer_payload.protocol import ErrorKind, JobSpecError


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), ErrorKind.OOM),
        (DataError("train.jsonl:3: bad row"), ErrorKind.DATA),
        (JobSpecError("method 'x'"), ErrorKind.CONFIG),
        (OSError(errno.ENOSPC, "No space left on device"), ErrorKind.DISK),
        (ValueError("something else"), ErrorKind.INTERNAL),
    ],
)
def test_exceptions_map_to_kinds_with_hints(error: BaseException, kind: ErrorKind) -> None:
    assert classify(error) is kind
    assert hint(kind)


def test_torch_oom_error_type_is_recognised() -> None:
    import torch

    assert classify(torch.OutOfMemoryError("boom")) is ErrorKind.OOM
    assert "micro-batch" in hint(ErrorKind.OOM)
