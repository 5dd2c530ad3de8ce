"""``rentune storage set|show|check``: the user's bucket, as the Storage settings hold it."""

from __future__ import annotations

import argparse
import json

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from desktop.core.settings import SettingsError
from desktop.core.storage import StorageError, StorageSettings, check_endpoint, parse_bucket_url
from desktop.services.buckets.check import check_bucket
from desktop.services.buckets.client import BucketError, bucket_keys
from desktop.services.platform.secrets import SecretName, SecretSource, SecretStore
from desktop.services.platform.settings import load_settings, update_settings

_KEYS = (SecretName.BUCKET_KEY_ID, SecretName.BUCKET_SECRET)


def run_storage(args: argparse.Namespace) -> int:
    """Dispatches ``rentune storage ACTION``."""
    if args.storage_command == "set":
        return _set(args.url, args.endpoint, args.region)
    if args.storage_command == "show":
        return _show()
    return _check(as_json=args.json)


def _set(url: str, endpoint: str, region: str) -> int:
    try:
        location, endpoint = parse_bucket_url(url), check_endpoint(endpoint)
        storage = StorageSettings(url=location.url, endpoint=endpoint, region=region.strip().lower())
    except (StorageError, ValueError) as exc:
        raise CliError(_first_line(exc)) from exc
    update_settings({"storage": storage.model_dump()})
    print(f"bucket set: {storage.url} at {storage.endpoint or 'AWS'}, region {storage.region}")
    print("next: rentune storage check (it writes, reads back and deletes a test object)")
    return EXIT_OK


def _show() -> int:
    storage = _storage()
    print(f"bucket    {storage.url or 'none set up (rentune storage set s3://BUCKET/PREFIX)'}")
    print(f"endpoint  {storage.endpoint or 'AWS'}")
    print(f"region    {storage.region}")
    secrets = SecretStore()
    for name in _KEYS:
        status = secrets.status(name)
        where = {SecretSource.KEYRING: "keyring", SecretSource.ENVIRONMENT: f"environment {name.env_var}"}.get(
            status.source, f"missing: rentune keys set {name.value}, or set {name.env_var}"
        )
        print(f"{name.label:<22}{where}")
    return EXIT_OK


def _check(*, as_json: bool) -> int:
    storage = _storage()
    if not storage.configured:
        raise CliError("no bucket is set up: rentune storage set s3://BUCKET/PREFIX [--endpoint URL] [--region R]")
    try:
        result = check_bucket(storage, bucket_keys())
    except BucketError as exc:
        raise CliError(f"the bucket check failed: {exc}", EXIT_FAILED) from exc
    if as_json:
        print(json.dumps({"url": result.location.url, "endpoint": result.endpoint, "seconds": result.seconds}))
    else:
        print(f"the bucket works: {result.words()}")
    return EXIT_OK


def _storage() -> StorageSettings:
    try:
        return load_settings().storage
    except SettingsError as exc:
        raise CliError(str(exc)) from exc


def _first_line(exc: Exception) -> str:
    """A pydantic error's own message (its first problem), else the exception's text."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(map(str, first['loc']))}: {str(first['msg']).removeprefix('Value error, ')}"
    return str(exc)
