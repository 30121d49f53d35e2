package org.omnidraft.specdecode;

import java.util.Map;

/**
 * What a drafter export folder's manifest asks for, and whether an Android app with the given
 * runtimes can run it: ExecuTorch's XNNPACK program (CPU), a static program for an ExecuTorch
 * delegate (export --delegate), or QNN context binaries for a Snapdragon HTP through ONNX Runtime
 * (export --device qnn-htp). The label is what the app shows as "drafter runs on".
 */
public final class DrafterChoice {
    public enum Runtime { EXECUTORCH, EXECUTORCH_STATIC, ORT_QNN }

    public final Runtime runtime;
    public final String label;
    /** Null when the app can run it; else why not, to show instead. */
    public final String unavailable;

    private DrafterChoice(Runtime runtime, String label, String unavailable) {
        this.runtime = runtime;
        this.label = label;
        this.unavailable = unavailable;
    }

    /**
     * {@code backendsHere}: the backend ids the app's ExecuTorch library registers
     * (ExecuTorchRuntime.getRegisteredBackends(); the Maven AAR: XnnpackBackend); {@code qnnHere}:
     * the app ships ONNX Runtime with the QNN provider.
     */
    public static DrafterChoice of(Map<String, Object> manifest, java.util.Set<String> backendsHere, boolean qnnHere) {
        String format = String.valueOf(manifest.get("format"));
        Object d = manifest.get("device");
        String device = d == null ? "cpu" : String.valueOf(d);
        Map<String, Object> info = manifest.get("device_info") instanceof Map
                ? Json.asObject(manifest.get("device_info"), "device_info") : java.util.Collections.<String, Object>emptyMap();
        if ("onnx".equals(format) && "qnn-htp".equals(device)) {
            String label = "Hexagon NPU (QNN HTP, " + info.get("soc") + ", " + manifest.get("quant") + ")";
            return new DrafterChoice(Runtime.ORT_QNN, label, qnnHere ? null : "this build has no ONNX Runtime QNN library");
        }
        if (!"executorch".equals(format)) {
            return new DrafterChoice(Runtime.EXECUTORCH, format + " on " + device,
                    "a " + format + " export on " + device + " does not run in this app; export the drafter with --format executorch or --device qnn-htp");
        }
        Object delegate = info.get("delegate");
        if (delegate == null) return new DrafterChoice(Runtime.EXECUTORCH, "CPU (ExecuTorch XNNPACK)", null);
        String name = String.valueOf(delegate);
        String label = info.get("targets") + " (ExecuTorch " + name + ")";
        String id = String.valueOf(info.get("backend_id"));
        String why = backendsHere.contains(id) ? null
                : "this app's ExecuTorch library has no " + id + " (it has " + backendsHere + ")";
        return new DrafterChoice(Runtime.EXECUTORCH_STATIC, label, why);
    }
}
