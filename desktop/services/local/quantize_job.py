"""Child-process job: quantise a GGUF file with llama.cpp and list the tensor types written.

Run as ``python quantize_job.py SOURCE TARGET TYPE`` (or ``--tensors FILE`` to list a GGUF's tensors only, as for
one quantised on a rented machine) with the vendored ``gguf-py`` on ``PYTHONPATH``. It imports
only the standard library, ``llama_cpp`` and ``gguf``, so it runs by path without the app on ``sys.path``. The last
output line is ``RESULT <json>``: ``{"tensors": [[name, type, row_width, dimensions], ...]}``.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

RESULT_PREFIX = "RESULT "


def quantize(source: str, target: str, type_name: str) -> None:
    """Quantises ``source`` into ``target`` with llama.cpp's ``LLAMA_FTYPE_MOSTLY_<TYPE>``; exits 3 on failure."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}")
    code = llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))
    if code != 0:
        print(f"llama_model_quantize returned {code}", flush=True)
        sys.exit(3)


def tensor_types(path: str) -> list[tuple[str, str, int, int]]:
    """Each tensor of a GGUF file: name, type, row width (``ne[0]``) and number of dimensions."""
    from gguf import GGUFReader  # type: ignore[import-not-found]

    reader = GGUFReader(path)
    return [(t.name, t.tensor_type.name, int(t.shape[0]), len(t.shape)) for t in reader.tensors]


def main(argv: list[str]) -> None:
    """Quantises (unless ``--tensors``) and prints the ``RESULT`` line."""
    if argv[0] == "--tensors":
        target = argv[1]
    else:
        source, target, type_name = argv
        quantize(source, target, type_name)
    print(RESULT_PREFIX + json.dumps({"tensors": tensor_types(target)}), flush=True)


if __name__ == "__main__":
    # Run by path, this file's folder comes first on sys.path, where the app's gguf.py would shadow the gguf package.
    sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    main(sys.argv[1:])
