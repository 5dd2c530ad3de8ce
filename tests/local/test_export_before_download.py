"""Export refuses what the converters would refuse before any download or merge, and says which outputs can be made.

The tiny test model's own BPE tokenizer is one llama.cpp's converter does not know (as a real model's new tokenizer
would be): its GGUF is refused from the config and tokenizer alone, served from the fake Hub, before a single weight
is downloaded, while the merged model can still be made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop.core.export.compatibility import OutputFormat, config_problems
from desktop.services.local.base_model import hub_cache
from desktop.services.local.common import LocalInputError
from desktop.services.local.export import ExportRequest, export, judge_outputs
from desktop.services.local.facts import adapter_facts, read_json
from tests.fakes.hub import FakeHub, HubRepo
from tests.fixtures.adapters import TrainedAdapter

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def hub(pattern_adapter: TrainedAdapter, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    import huggingface_hub.constants

    served = FakeHub({"someone/tiny": HubRepo(pattern_adapter.base)}).start()
    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    yield served
    served.stop()


def test_a_gguf_llama_cpp_would_refuse_is_refused_before_the_weights_come(
    pattern_adapter: TrainedAdapter, hub: FakeHub, tmp_path: Path
) -> None:
    steps: list[str] = []
    request = ExportRequest(pattern_adapter.path, "someone/tiny", tmp_path / "out", gguf=("Q8_0",))
    with pytest.raises(LocalInputError) as refused:
        asyncio.run(export(request, lambda text, _fraction: steps.append(text)))
    message = str(refused.value)
    assert message.startswith("cannot write gguf: llama.cpp does not recognise the tokenizer")
    assert message.endswith("nothing was downloaded or written")
    fetched = [path for method, path, _token in hub.requests if method == "GET" and "/resolve/" in path]
    assert fetched and not any(path.endswith(".safetensors") for path in fetched)  # config and tokenizer only
    assert not list(hub_cache().rglob("*.safetensors"))
    assert not any("merg" in step.lower() for step in steps) and not (tmp_path / "out").exists()


def test_the_outputs_that_can_be_made_are_said_before_anything_is_done(pattern_adapter: TrainedAdapter) -> None:
    verdicts = asyncio.run(judge_outputs(pattern_adapter.path, pattern_adapter.base))
    assert verdicts[OutputFormat.MERGED].possible
    assert not verdicts[OutputFormat.GGUF].possible and "tokenizer" in verdicts[OutputFormat.GGUF].reason
    assert not verdicts[OutputFormat.OLLAMA].possible and not verdicts[OutputFormat.LORA_GGUF].possible


def test_a_gguf_llama_cpp_knows_passes_the_check(gguf_pattern_adapter: TrainedAdapter) -> None:
    verdicts = asyncio.run(judge_outputs(gguf_pattern_adapter.path, gguf_pattern_adapter.base, [OutputFormat.GGUF]))
    assert verdicts[OutputFormat.GGUF].possible and verdicts[OutputFormat.LORA_GGUF].possible


def test_an_adapter_for_another_size_is_found_from_the_config_alone(pattern_adapter: TrainedAdapter) -> None:
    config = read_json(pattern_adapter.base / "config.json", "the base")
    facts = adapter_facts(pattern_adapter.path)
    assert config_problems(facts, config) == []
    wider = config | {"hidden_size": 96, "intermediate_size": 200, "head_dim": 24}
    assert any("wide, which no weight of the base is" in line for line in config_problems(facts, wider))
    shallower = config | {"num_hidden_layers": 1}
    assert any("but the base has 1 layers" in line for line in config_problems(facts, shallower))
