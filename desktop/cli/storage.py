"""``rentune storage set|show|check|ls|du|prune|rm``: the user's bucket, as the Storage settings hold it."""

from __future__ import annotations

import argparse
import json

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from desktop.core.settings import SettingsError
from desktop.core.storage import StorageError, StorageSettings, check_endpoint, parse_bucket_url
from desktop.services.buckets.check import check_bucket
from desktop.services.buckets.client import BucketError, BucketKeys, bucket_keys
from desktop.services.buckets.inventory import BucketUsage, bucket_usage, delete_run, prune_bucket
from desktop.services.platform.secrets import SecretName, SecretSource, SecretStore
from desktop.services.platform.settings import load_settings, update_settings

_KEYS = (SecretName.BUCKET_KEY_ID, SecretName.BUCKET_SECRET)


def run_storage(args: argparse.Namespace) -> int:
    """Dispatches ``rentune storage ACTION``."""
    if args.storage_command == "set":
        return _set(
            args.url, args.endpoint, args.region, keep=args.keep, price=args.price, home=args.full_checkpoints_home
        )
    if args.storage_command == "show":
        return _show()
    if args.storage_command == "check":
        return _check(as_json=args.json)
    storage = _configured()
    try:
        keys = bucket_keys()
        if args.storage_command == "prune":
            return _prune(storage, keys, args.keep, args.run)
        if args.storage_command == "rm":
            count, freed = delete_run(storage, keys, args.run)
            print(f"deleted {count} checkpoint(s) of run {args.run} from the bucket, {freed / 1e6:,.1f} MB")
            return EXIT_OK
        usage = bucket_usage(storage, keys)
    except BucketError as exc:
        raise CliError(f"the bucket cannot be read: {exc}", EXIT_FAILED) from exc
    return _ls(usage, args.run, as_json=args.json) if args.storage_command == "ls" else _du(storage, usage, args.json)


def _ls(usage: BucketUsage, run_id: str | None, *, as_json: bool) -> int:
    runs = {run: steps for run, steps in sorted(usage.checkpoints.items()) if run_id in (None, run)}
    if as_json:
        rows = [{"run": run, "checkpoint": c.name, "bytes": c.bytes, "whole": c.whole}
                for run, steps in runs.items() for _step, c in sorted(steps.items())]  # fmt: skip
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not runs:
        print("no checkpoints in the bucket" + (f" for run {run_id}" if run_id else ""))
    for run, steps in runs.items():
        print(run)
        for _step, c in sorted(steps.items()):
            state = "whole" if c.whole else "unfinished (no seal: never resumed from)"
            print(f"  {c.name:<18}{c.bytes / 1e6:>12,.1f} MB  {state}")
    return EXIT_OK


def _du(storage: StorageSettings, usage: BucketUsage, as_json: bool) -> int:
    stored = sum(c.bytes for steps in usage.checkpoints.values() for c in steps.values())
    monthly = usage.monthly_usd(storage.price_per_gb_month)
    if as_json:
        print(json.dumps({"checkpoints_bytes": stored, "data_bytes": usage.data_bytes, "other_bytes": usage.other_bytes,
                          "total_bytes": usage.total_bytes, "monthly_usd": round(monthly, 4)}))  # fmt: skip
        return EXIT_OK
    print(f"checkpoints  {stored / 1e9:>10,.3f} GB  ({len(usage.checkpoints)} runs)")
    print(f"data         {usage.data_bytes / 1e9:>10,.3f} GB")
    print(f"total        {usage.total_bytes / 1e9:>10,.3f} GB  about ${monthly:,.2f} a month at "
          f"${storage.price_per_gb_month:g} per GB-month")  # fmt: skip
    return EXIT_OK


def _prune(storage: StorageSettings, keys: BucketKeys, keep: int | None, run_id: str | None) -> int:
    if keep is not None and keep < 1:
        raise CliError("--keep must be at least 1: a run's newest whole checkpoint always stays")
    count, freed = prune_bucket(storage, keys, keep or storage.keep_checkpoints, run_id)
    print(f"deleted {count} checkpoint(s), {freed / 1e6:,.1f} MB; each run keeps its newest "
          f"{keep or storage.keep_checkpoints} whole one(s)")  # fmt: skip
    return EXIT_OK


def _configured() -> StorageSettings:
    storage = _storage()
    if not storage.configured:
        raise CliError("no bucket is set up: rentune storage set s3://BUCKET/PREFIX [--endpoint URL] [--region R]")
    return storage


def _set(url: str, endpoint: str, region: str, *, keep: int, price: float, home: bool) -> int:
    if not 1 <= keep <= 1000:
        raise CliError("--keep must be from 1 to 1000: a run's newest whole checkpoint always stays")
    if not 0 <= price <= 10:
        raise CliError("--price must be from 0 to 10 USD per GB-month (S3 Standard's is 0.023)")
    try:
        location, endpoint = parse_bucket_url(url), check_endpoint(endpoint)
        storage = StorageSettings(
            url=location.url, endpoint=endpoint, region=region.strip().lower(), keep_checkpoints=keep,
            price_per_gb_month=price, full_checkpoints_home=home,
        )  # fmt: skip
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
    print(f"keep      the newest {storage.keep_checkpoints} whole checkpoint(s) of each run")
    where = "come home too" if storage.full_checkpoints_home else "stay in the bucket (adapters come home)"
    print(f"full fine-tunes' checkpoints {where}")
    secrets = SecretStore()
    for name in _KEYS:
        status = secrets.status(name)
        where = {SecretSource.KEYRING: "keyring", SecretSource.ENVIRONMENT: f"environment {name.env_var}"}.get(
            status.source, f"missing: rentune keys set {name.value}, or set {name.env_var}"
        )
        print(f"{name.label:<22}{where}")
    return EXIT_OK


def _check(*, as_json: bool) -> int:
    storage = _configured()
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
