from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from desktop.core.redaction import MASK, redact

HF = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN"


def test_known_secret_values_are_masked_everywhere() -> None:
    secret = "s3cr3t-value-xyz"
    assert redact(f"connect with {secret} and again {secret}", [secret]) == f"connect with {MASK} and again {MASK}"


def test_well_known_token_formats_are_masked_without_being_known() -> None:
    text = f"HF_TOKEN={HF} Authorization: Bearer abcdefghijklmnop"
    out = redact(text)
    assert HF not in out
    assert "abcdefghijklmnop" not in out


def test_private_keys_are_masked() -> None:
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE\n-----END OPENSSH PRIVATE KEY-----"
    assert "b3BlbnNzaC1rZXktdjE" not in redact(f"key:\n{pem}\n")


def test_short_values_are_not_treated_as_secrets() -> None:
    assert redact("the cat sat", ["cat"]) == "the cat sat"


def test_ordinary_text_is_untouched() -> None:
    text = "Training step 40: loss 1.23, 2,345 tokens/s on 127.0.0.1:2222"
    assert redact(text) == text


@given(st.text(min_size=0, max_size=80), st.text(alphabet="abcdefghijk0123456789", min_size=8, max_size=40))
def test_a_known_secret_never_survives(prefix: str, secret: str) -> None:
    assert secret not in redact(prefix + secret + prefix, [secret])
