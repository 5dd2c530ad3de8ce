from __future__ import annotations

import json
from pathlib import Path

import pytest

from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.gpus import GpuSpec, gpus_from_json

RESOURCES = Path(__file__).resolve().parents[3] / "resources"


@pytest.fixture(scope="session")
def catalog() -> ModelCatalog:
    return ModelCatalog.from_json(json.loads((RESOURCES / "models.json").read_text()))


@pytest.fixture(scope="session")
def gpus() -> list[GpuSpec]:
    return gpus_from_json(json.loads((RESOURCES / "gpus.json").read_text()))
