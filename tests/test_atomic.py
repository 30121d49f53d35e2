"""omnidraft.atomic: a failed write keeps the previous file and leaves no temporary file behind."""

from __future__ import annotations

import json
import os
import stat

import pytest

from omnidraft.atomic import atomic_path, save_figure, write_bytes, write_json


def test_write_replaces_whole_file_with_shareable_mode(tmp_path):
    p = tmp_path / "sub" / "a.json"
    write_json(p, {"x": 1})
    write_json(p, {"x": 2}, compact=True)
    assert json.loads(p.read_text()) == {"x": 2}
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o644
    assert os.listdir(p.parent) == ["a.json"]


def test_exception_mid_write_keeps_previous_file(tmp_path):
    p = tmp_path / "a.bin"
    write_bytes(p, b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(p) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("killed")
    assert p.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["a.bin"]


def test_save_figure_keeps_png_extension(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    p = save_figure(fig, tmp_path / "plot.png")
    plt.close(fig)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(tmp_path) == ["plot.png"]
