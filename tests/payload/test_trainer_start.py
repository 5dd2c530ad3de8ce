"""The trainer starts without libraries its job does not use (each second of a start is paid on the machine)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from trainer_payload.train import leave_out_unused_quantisation

class Job:
    method = sys.argv[1]

left_out = leave_out_unused_quantisation(Job())
import peft, transformers
from peft import LoraConfig, get_peft_model
loaded = sys.modules.get("bitsandbytes") is not None
print(f"{left_out} {loaded}")
"""


# One method on each side of BITSANDBYTES_METHODS: full and full-8bit take the same branch as lora and qlora.
@pytest.mark.parametrize(("method", "expected"), [("lora", "True False"), ("qlora", "False True")])
def test_bitsandbytes_is_imported_only_by_the_methods_that_quantise(method: str, expected: str) -> None:
    probe = [sys.executable, "-c", PROBE, method]
    done = subprocess.run(probe, capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == expected.split()
