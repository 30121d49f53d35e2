"""A static-shape ExecuTorch program lowered to a delegate (export/et_delegates.py) as a backend.

The program has one method ``forward_w{w}`` per call width with the static graph's signature, so the
static-KV backend (runtime/backends/static_kv.py) drives it as it drives ONNX Runtime sessions. It
runs only where ExecuTorch's runtime has the delegate registered; a program for a delegate this
machine lacks (CoreML, Vulkan here) is refused in one line before anything is loaded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from omnidraft.errors import ManifestError, ModelFolderError
from omnidraft.native_output import FirstUse, without_native_lines
from omnidraft.runtime.backends.static_kv import StaticKvBackend, io_names
from omnidraft.runtime.manifest import Manifest


class _Method:
    """An ExecuTorch method behind the session interface StaticKvBackend drives."""

    def __init__(self, method, names: list[str]) -> None:
        self._method, self._names = method, names
        self._first_run = FirstUse()  # a program whose load left the threadpool unstarted starts it here

    def get_inputs(self):
        return [type("Input", (), {"name": n}) for n in self._names]

    def run(self, _outputs, feed):
        import torch

        with self._first_run():
            out = self._method.execute([torch.from_numpy(np.ascontiguousarray(feed[n])) for n in self._names])
        return [o.numpy() for o in out]


def open_static_program(export_dir: str | Path, manifest: Manifest) -> StaticKvBackend:
    from executorch.runtime import Runtime

    export_dir, info = Path(export_dir), manifest.device_info
    try:
        delegate, backend_id, methods = info["delegate"], info["backend_id"], info["methods"]
    except KeyError as exc:
        raise ManifestError(
            f"{export_dir}/manifest.json lacks device_info.{exc.args[0]}; re-export with `{manifest.export_command}`"
        ) from None
    runtime = Runtime.get()
    here = runtime.backend_registry.registered_backend_names
    if backend_id not in here:
        raise ModelFolderError(
            f"{export_dir} holds a program lowered to {delegate} ({info.get('targets', backend_id)}), and this "
            f"machine's ExecuTorch runtime has no {backend_id} (it has {', '.join(here)}): run it on such a "
            "device, or export the drafter with --delegate xnnpack"
        )
    path = export_dir / manifest.artifact_file
    names = io_names(manifest.num_layers)[0]
    try:
        with without_native_lines():  # the delegate's init may start ExecuTorch's threadpool, which probes the CPU
            program = runtime.load_program(path)
            sessions = {int(w): _Method(program.load_method(m), names) for w, m in methods.items()}
    except Exception as exc:  # the pybind layer raises RuntimeError/ValueError for bad programs
        raise ModelFolderError(
            f"ExecuTorch cannot load {path} ({str(exc).splitlines()[0][:200]}); "
            f"re-export with `{manifest.export_command}`"
        ) from None
    return StaticKvBackend(export_dir, manifest, sessions, name=f"executorch-{delegate}")
