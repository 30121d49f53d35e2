"""The onnxruntime-genai bench peer's row when it cannot run: a target export without the builder's
genai_config.json (a torch.onnx graph, an older export) is named with the fix, and the other peers
still run. Its generator against our own decode is tested in tests/test_onnx_genai.py."""

from __future__ import annotations

from types import SimpleNamespace

from omnidraft.bench import ortgenai_peer, peer_section


def test_a_target_export_without_genai_config_gets_a_row_saying_so(tmp_path):
    bench = SimpleNamespace(
        s=SimpleNamespace(peers=("ort-genai",), threads=1, max_seq_len=64, max_new_tokens=5, backend="ort"),
        engines={"ort": SimpleNamespace(paths=(tmp_path / "d", tmp_path))},
        report={"rows": [], "peers": []},
        genai=None,
    )
    peer_section.run_peers(bench, SimpleNamespace(name="code", prompts=["def f():"]))
    (row,) = bench.report["peers"]
    assert row["name"] == ortgenai_peer.PEER_NAME and row["tokens_per_s"] is None
    assert row["status"].startswith("no genai_config.json") and "re-export the target" in row["status"]
