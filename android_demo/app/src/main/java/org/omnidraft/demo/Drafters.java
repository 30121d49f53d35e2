package org.omnidraft.demo;

import ai.onnxruntime.OrtEnvironment;
import ai.onnxruntime.OrtException;
import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.omnidraft.specdecode.CoreException;
import org.omnidraft.specdecode.DrafterChoice;
import org.omnidraft.specdecode.Files8;
import org.omnidraft.specdecode.Json;
import org.omnidraft.specdecode.Model;
import org.omnidraft.specdecode.StaticGraph;
import org.omnidraft.specdecode.StaticKvModel;
import org.omnidraft.specdecode.Utf8;
import org.pytorch.executorch.ExecuTorchRuntime;
import org.pytorch.executorch.Module;

/**
 * The drafter exports pushed beside the target: {@code drafter/} and any {@code drafter-<name>/}
 * (e.g. {@code drafter-qnn/} from {@code --device qnn-htp}, {@code drafter-vulkan/} from
 * {@code --delegate vulkan}). Each is offered with where it runs; one this build cannot run is
 * listed with the reason instead of failing at load.
 */
final class Drafters {
    static final class Option {
        final File dir;
        final DrafterChoice choice;
        final Map<String, Object> manifest;

        Option(File dir, DrafterChoice choice, Map<String, Object> manifest) {
            this.dir = dir;
            this.choice = choice;
            this.manifest = manifest;
        }

        @Override public String toString() {
            return dir.getName() + ": " + choice.label + (choice.unavailable == null ? "" : " — unavailable");
        }
    }

    private Drafters() {}

    static Set<String> executorchBackends() {
        return new HashSet<String>(Arrays.asList(ExecuTorchRuntime.getRegisteredBackends()));
    }

    static List<Option> find(File root) throws CoreException {
        List<Option> out = new ArrayList<Option>();
        File[] dirs = root.listFiles();
        if (dirs != null) {
            Arrays.sort(dirs);
            Set<String> here = executorchBackends();
            for (File d : dirs) {
                String n = d.getName();
                if (!(n.equals("drafter") || n.startsWith("drafter-")) || !new File(d, "manifest.json").isFile()) continue;
                Map<String, Object> m = manifest(d);
                out.add(new Option(d, DrafterChoice.of(m, here, true), m));
            }
        }
        if (out.isEmpty()) {
            throw new CoreException("No drafter export under " + root + ". Export one with `omnidraft export` and push it:\n"
                    + ModelFiles.pushCommand("drafter"));
        }
        return out;
    }

    private static Map<String, Object> manifest(File dir) throws CoreException {
        File f = new File(dir, "manifest.json");
        try {
            return Json.asObject(Json.parse(new String(Files8.readAll(f), Utf8.UTF8)), "manifest.json");
        } catch (IOException | IllegalArgumentException e) {
            throw new CoreException(f + " cannot be read (" + e.getMessage() + "); push the folder again");
        }
    }

    /** The static-KV model of a QNN or delegate export (an XNNPACK drafter loads as ExecuTorchModel). */
    static Model openStatic(Option o) throws CoreException {
        if (o.choice.unavailable != null) throw new CoreException(o.dir.getName() + " cannot run here: " + o.choice.unavailable);
        Map<String, Object> m = o.manifest;
        try {
            Map<String, Object> info = Json.asObject(m.get("device_info"), "device_info");
            int layers = (int) Json.asLong(m.get("num_layers"), "num_layers");
            int heads = (int) Json.asLong(m.get("num_kv_heads"), "num_kv_heads");
            int dim = (int) Json.asLong(m.get("head_dim"), "head_dim");
            int context = (int) Json.asLong(info.get("context_len"), "context_len");
            List<Object> widths = Json.asArray(info.get("call_widths"), "call_widths");
            StaticGraph[] graphs = new StaticGraph[widths.size()];
            if (o.choice.runtime == DrafterChoice.Runtime.ORT_QNN) {
                Map<String, Object> files = Json.asObject(info.get("graphs"), "graphs");
                OrtEnvironment env = OrtEnvironment.getEnvironment();
                boolean fp16 = "fp16".equals(m.get("quant"));
                for (int i = 0; i < graphs.length; i++) {
                    int w = (int) Json.asLong(widths.get(i), "call width");
                    Map<String, Object> g = Json.asObject(files.get(String.valueOf(w)), "graph");
                    File model = new File(o.dir, Json.asString(g.get("model"), "model"));
                    File binary = new File(o.dir, Json.asString(g.get("binary"), "binary"));
                    if (!model.isFile() || !binary.isFile()) {
                        throw new CoreException(o.dir + " lacks " + (model.isFile() ? binary : model).getName()
                                + " (an EPContext model needs its context binary beside it); push the whole folder again");
                    }
                    graphs[i] = new OrtQnnGraph(env, model, w, String.valueOf(info.get("soc_model")), String.valueOf(info.get("htp_arch")),
                            fp16, layers, context, heads, dim);
                }
            } else {
                Module module = Module.load(new File(o.dir, Json.asString(m.get("artifact_file"), "artifact_file")).getAbsolutePath(),
                        Module.LOAD_MODE_MMAP);
                Map<String, Object> methods = Json.asObject(info.get("methods"), "methods");
                for (int i = 0; i < graphs.length; i++) {
                    int w = (int) Json.asLong(widths.get(i), "call width");
                    graphs[i] = new ExecuTorchStaticGraph(module, Json.asString(methods.get(String.valueOf(w)), "method"), w, context, heads, dim);
                }
            }
            return new StaticKvModel(graphs, (int) Json.asLong(m.get("vocab_size"), "vocab_size"), context, layers, heads, dim, kept(m));
        } catch (IllegalArgumentException e) {
            throw new CoreException(o.dir + "/manifest.json lacks a field (" + e.getMessage() + "); re-export with omnidraft export");
        } catch (OrtException e) {
            throw new CoreException("ONNX Runtime's QNN provider cannot load " + o.dir.getName() + " (" + e.getMessage()
                    + "); the context binaries are for " + Json.asObject(m.get("device_info"), "device_info").get("soc")
                    + ": re-export with --soc set to this phone's SoC");
        }
    }

    private static int[] kept(Map<String, Object> m) {
        Object dv = m.get("draft_vocab");
        if (!(dv instanceof Map) || ((Map<?, ?>) dv).isEmpty()) return null;
        List<Object> ids = Json.asArray(((Map<?, ?>) dv).get("kept"), "draft_vocab.kept");
        int[] out = new int[ids.size()];
        for (int i = 0; i < out.length; i++) out[i] = (int) Json.asLong(ids.get(i), "kept id");
        return out;
    }
}
