"""Qualcomm's Hexagon NPU (HTP) through ONNX Runtime's QNN execution provider.

``onnxruntime-qnn`` (the ``npu`` extra) is a plugin provider for the stock ``onnxruntime``: it
bundles Qualcomm's QAIRT HTP libraries, registers with
``onnxruntime.register_execution_provider_library`` and compiles a static graph into an EPContext
model plus a QNN context binary for one SoC. On a Snapdragon phone the binary runs on the HTP; on an
x86 host the same libraries run it through the HTP simulator (same arithmetic, not device speed).

The runtime backend is the static-KV backend (runtime/backends/static_kv.py) with its sessions on
this provider; CPU fallback is disabled, so a graph that loads runs wholly on the HTP.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from omnidraft.errors import InvalidArgument, ManifestError
from omnidraft.runtime.manifest import Manifest

DEVICE = "qnn-htp"
EXTRA_HINT = "install the npu extra: pip install 'omnidraft[npu]' (onnxruntime-qnn)"
# SoC -> (QNN soc_model id, HTP architecture). Each pair checked here: a binary compiled with the id
# names that SoC and architecture in its own build configuration (binary_target below).
SOCS = {
    "SM8350": (30, 68),  # Snapdragon 888
    "SM8450": (36, 69),  # Snapdragon 8 Gen 1
    "SM8550": (43, 73),  # Snapdragon 8 Gen 2
    "SM8650": (57, 75),  # Snapdragon 8 Gen 3
    "SM8750": (69, 79),  # Snapdragon 8 Elite
    "SC8380XP": (60, 73),  # Snapdragon X Elite
}
DEFAULT_SOC = "SM8650"
# The SoC of the device the runtime runs on. Unset (a host running the simulator), the export's own.
SOC_ENV = "OMNIDRAFT_QNN_SOC"
# Where the HTP backend writes its build configuration into a context binary, and how far in.
_TARGET = re.compile(rb"soc_type=(\w+);arch=(\d+);")
_TARGET_SCAN_BYTES = 1 << 22

_registered: list = []


def qnn_package():
    try:
        import onnxruntime_qnn
    except ImportError:
        raise InvalidArgument(f"onnxruntime-qnn is not installed; {EXTRA_HINT}") from None
    return onnxruntime_qnn


def versions() -> dict[str, str]:
    q = qnn_package()
    from onnxruntime_qnn import build_and_package_info as b

    return {"onnxruntime_qnn": q.__version__, "qairt": getattr(b, "qnn_version", "unknown")}


def _devices() -> list:
    import onnxruntime as ort

    q = qnn_package()
    if not _registered:
        ort.register_execution_provider_library(q.get_ep_name(), q.get_library_path())
        _registered.append(q.get_ep_name())
    return [d for d in ort.get_ep_devices() if d.ep_name == q.get_ep_name()]


def check_soc(soc: str) -> tuple[int, int]:
    if soc not in SOCS:
        raise InvalidArgument(f"unknown SoC {soc!r}; choose one of: {', '.join(SOCS)}")
    return SOCS[soc]


def session_options(*, soc: str, fp16: bool, cpu_fallback: bool = False):
    """Session options that put a graph on the HTP of ``soc``; without ``cpu_fallback`` a node the HTP
    cannot take fails the session (the exporter allows it, to name such nodes)."""
    import onnxruntime as ort

    soc_model, arch = check_soc(soc)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    provider = {
        "backend_path": qnn_package().get_qnn_htp_path(),
        "soc_model": str(soc_model),
        "htp_arch": str(arch),
        "enable_htp_fp16_precision": "1" if fp16 else "0",
    }
    opts.add_provider_for_devices(_devices(), provider)
    opts.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if cpu_fallback else "1")
    return opts


def binary_target(path: Path) -> tuple[str, int] | None:
    """(SoC, HTP arch) a context binary was compiled for, read from its build configuration."""
    with open(path, "rb") as f:
        m = _TARGET.search(f.read(_TARGET_SCAN_BYTES))
    return (m.group(1).decode(), int(m.group(2))) if m else None


def device_soc(manifest: Manifest) -> str:
    return os.environ.get(SOC_ENV) or manifest.device_info.get("soc", "")


def check_binaries(export_dir: Path, manifest: Manifest) -> None:
    """Refuse context binaries compiled for another SoC than the manifest's, or than this device's."""
    soc = manifest.device_info.get("soc")
    where = f"{export_dir}/manifest.json"
    if soc not in SOCS:
        raise ManifestError(f"{where} names no known QNN SoC ({soc!r}); re-export with `{manifest.export_command}`")
    here = device_soc(manifest)
    if here != soc:
        raise ManifestError(
            f"the context binaries in {export_dir} are compiled for {soc} (HTP v{SOCS[soc][1]}), and this device "
            f"is {here} ({SOC_ENV}); re-export with --soc {here}"
        )
    for g in manifest.device_info.get("graphs", {}).values():
        binary = export_dir / str(g.get("binary", ""))
        target = binary_target(binary) if binary.is_file() else None  # a missing one: load_manifest says so
        if target is not None and target != (soc, SOCS[soc][1]):
            raise ManifestError(
                f"{export_dir / g['binary']} is a context binary for {target[0]} (HTP v{target[1]}), not the "
                f"manifest's {soc}; re-export with `{manifest.export_command}`"
            )


def open_qnn(export_dir: str | Path, manifest: Manifest):
    """The static-KV backend with every width's EPContext graph on the HTP (the simulator on x86)."""
    import onnxruntime as ort

    from omnidraft.runtime.backends.static_kv import StaticKvBackend, open_sessions

    export_dir = Path(export_dir)
    qnn_package()  # absent: the one line naming the extra, not a load failure per graph
    check_binaries(export_dir, manifest)
    fp16 = manifest.quant == "fp16"
    soc = manifest.device_info["soc"]

    def make(path: Path):
        # A QDQ graph quantizes its inputs and dequantizes its outputs on the CPU (the exporter checked
        # that nothing else is left there); an fp16 graph runs wholly on the HTP.
        return ort.InferenceSession(str(path), sess_options=session_options(soc=soc, fp16=fp16, cpu_fallback=not fp16))

    return StaticKvBackend(export_dir, manifest, open_sessions(export_dir, manifest, make, "the QNN HTP"), name=DEVICE)
