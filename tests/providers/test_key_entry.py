"""A key check that goes wrong says so in words for each provider: who, what went wrong, what to do; never the
request line ("could not read the account: GET /api/v0/users/current/")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import ProviderName
from desktop.services.providers.key_entry import KeyEntryError, add_key
from desktop.services.providers.registry import PROVIDERS

FAKES = {ProviderName.RUNPOD: "fake_runpod", ProviderName.VAST: "fake_vast", ProviderName.LAMBDA: "fake_lambda"}


@pytest.mark.parametrize("name", list(FAKES))
def test_an_address_that_is_not_the_providers_api_is_said_in_words(
    name: ProviderName, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud: Any = request.getfixturevalue(FAKES[name])
    address = cloud.serve() + "/not-the-api"  # the fake answers 404 "no route GET /not-the-api/..." to everything
    monkeypatch.setenv(PROVIDERS[name].url_env, address)
    with pytest.raises(KeyEntryError) as caught:
        asyncio.run(add_key(name, cloud.valid_key, SecretStore()))
    said = str(caught.value)
    words = said.replace(f"({address})", "(ADDRESS)")  # the address the user set is named; its port may hold "404"
    for raw in ("/not-the-api/", "GET ", "no route", "HTTP", "404"):
        assert raw not in words, f"no raw request in the message ({raw!r}): {said}"
    assert said.startswith(f"{name.label} did not recognise Rentune's request to check the key"), said
    assert f"{PROVIDERS[name].url_env} ({address}) may not be {name.label}'s API" in said, said


def test_a_provider_that_cannot_be_reached_is_said_without_an_address_nobody_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(type(PROVIDERS[ProviderName.VAST]), "url", property(lambda _info: "http://127.0.0.1:9/api/v0"))
    monkeypatch.delenv(PROVIDERS[ProviderName.VAST].url_env, raising=False)  # nobody set an address
    with pytest.raises(KeyEntryError) as caught:
        asyncio.run(add_key(ProviderName.VAST, "some-key", SecretStore()))
    said = str(caught.value)
    assert said == "Rentune could not reach Vast.ai to check the key. Check the internet connection and try again."
