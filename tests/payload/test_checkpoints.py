from __future__ import annotations

from pathlib import Path

from trainer_payload.checkpoints import is_complete, newest_complete, seal_checkpoint


def make_checkpoint(root: Path, step: int, sealed: bool = True) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * step)
    (folder / "optimizer.pt").write_bytes(b"x" * 100)
    if sealed:
        seal_checkpoint(folder, step)
    return folder


def test_newest_sealed_checkpoint_wins_and_broken_newer_ones_are_removed(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    good = make_checkpoint(tmp_path, 20)
    truncated = make_checkpoint(tmp_path, 30)
    (truncated / "adapter_model.safetensors").write_bytes(b"half")
    unsealed = make_checkpoint(tmp_path, 40, sealed=False)
    assert newest_complete(tmp_path) == good
    assert not truncated.exists() and not unsealed.exists()


def test_same_size_corruption_is_caught_by_the_checksum(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 10)
    data = bytearray((folder / "optimizer.pt").read_bytes())
    data[0] ^= 1
    (folder / "optimizer.pt").write_bytes(bytes(data))
    assert not is_complete(folder)
    assert newest_complete(tmp_path) is None
