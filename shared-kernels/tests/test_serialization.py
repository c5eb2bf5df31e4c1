"""Model folders (icml25.kernels.serialization): exact round trip and clear errors."""

import json
from pathlib import Path

import pytest
import torch

from icml25.kernels.serialization import CONFIG_NAME, WEIGHTS_NAME, read_folder, write_folder

FMT = dict(format="icml25.test.Thing", version=2)
READ = dict(FMT, writer="Thing.save", package="icml25-test")


def test_round_trip_is_bit_exact_and_keeps_dtypes(tmp_path: Path) -> None:
    tensors = {
        "w": torch.randn(3, 4, dtype=torch.float64),
        "idx": torch.arange(5),
        "h": torch.randn(2).half(),
    }
    folder = write_folder(tmp_path / "m", tensors, {"params": {"k": 3}}, **FMT)
    again, config, loaded = read_folder(folder, **READ)
    assert again == folder and config == {"format": "icml25.test.Thing", "version": 2, "params": {"k": 3}}
    assert set(loaded) == set(tensors)
    for key, t in tensors.items():
        assert loaded[key].dtype == t.dtype and torch.equal(loaded[key], t)
    first = (folder / WEIGHTS_NAME).read_bytes()
    write_folder(folder, loaded, {"params": {"k": 3}}, **FMT)
    assert (folder / WEIGHTS_NAME).read_bytes() == first


def test_errors_name_the_problem(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "m", {"w": torch.ones(2)}, {}, **FMT)
    with pytest.raises(TypeError, match=r"path must be a str or os\.PathLike"):
        read_folder(3, **READ)
    with pytest.raises(ValueError, match="non-empty folder path"):
        read_folder("", **READ)
    with pytest.raises(FileNotFoundError, match=r"does not exist: expected a folder written by Thing\.save"):
        read_folder(tmp_path / "nothing", **READ)
    with pytest.raises(NotADirectoryError, match="got the file"):
        read_folder(folder / CONFIG_NAME, **READ)
    with pytest.raises(NotADirectoryError, match="must be a folder"):
        write_folder(folder / CONFIG_NAME, {}, {}, **FMT)
    with pytest.raises(ValueError, match=r"must have format .icml25\.other."):
        read_folder(folder, **dict(READ, format="icml25.other"))
    with pytest.raises(ValueError, match=r"format version 2; this icml25-test reads versions 1..1"):
        read_folder(folder, **dict(READ, version=1))
    (folder / WEIGHTS_NAME).write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        read_folder(folder, **READ)
    (folder / CONFIG_NAME).write_text("{broken")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_folder(folder, **READ)
    (folder / CONFIG_NAME).write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="got 'list'"):
        read_folder(folder, **READ)
    (folder / WEIGHTS_NAME).unlink()
    with pytest.raises(FileNotFoundError, match=f"has no {WEIGHTS_NAME}"):
        read_folder(folder, **READ)
