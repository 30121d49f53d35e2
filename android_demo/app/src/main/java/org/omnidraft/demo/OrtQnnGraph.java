package org.omnidraft.demo;

import ai.onnxruntime.OnnxTensor;
import ai.onnxruntime.OrtEnvironment;
import ai.onnxruntime.OrtException;
import ai.onnxruntime.OrtSession;
import java.io.File;
import java.nio.FloatBuffer;
import java.nio.IntBuffer;
import java.util.HashMap;
import java.util.Map;
import org.omnidraft.specdecode.CoreException;
import org.omnidraft.specdecode.StaticGraph;

/**
 * One width's EPContext model from {@code omnidraft export --device qnn-htp} (it names its QNN
 * context binary beside it) on ONNX Runtime's QNN provider with the HTP backend: the drafter runs
 * on the Hexagon NPU. Mirrors runtime/backends/qnn.py: the SoC and HTP architecture come from the
 * manifest; an fp16 graph may not fall back to the CPU, a QDQ graph converts its I/O there.
 */
final class OrtQnnGraph implements StaticGraph {
    private final OrtEnvironment env;
    private final OrtSession session;
    private final int width, layers, context, kvHeads, headDim;

    OrtQnnGraph(OrtEnvironment env, File model, int width, String socModel, String htpArch, boolean fp16,
                int layers, int context, int kvHeads, int headDim) throws OrtException {
        this.env = env;
        this.width = width;
        this.layers = layers;
        this.context = context;
        this.kvHeads = kvHeads;
        this.headDim = headDim;
        Map<String, String> qnn = new HashMap<String, String>();
        qnn.put("backend_path", "libQnnHtp.so");
        qnn.put("soc_model", socModel);
        qnn.put("htp_arch", htpArch);
        qnn.put("enable_htp_fp16_precision", fp16 ? "1" : "0");
        OrtSession.SessionOptions opts = new OrtSession.SessionOptions();
        opts.addQnn(qnn);
        opts.addConfigEntry("session.disable_cpu_ep_fallback", fp16 ? "1" : "0");
        this.session = env.createSession(model.getAbsolutePath(), opts);
    }

    @Override public int width() { return width; }

    @Override
    public float[] run(int[] ids, int[] positions, float[] bias, float[][] past, float[][] newRows) throws CoreException {
        Map<String, OnnxTensor> feed = new HashMap<String, OnnxTensor>();
        try {
            feed.put("input_ids", OnnxTensor.createTensor(env, IntBuffer.wrap(ids), new long[] {1, width}));
            feed.put("position_ids", OnnxTensor.createTensor(env, IntBuffer.wrap(positions), new long[] {1, width}));
            feed.put("attention_bias", OnnxTensor.createTensor(env, FloatBuffer.wrap(bias), new long[] {1, 1, width, context + width}));
            long[] kv = {1, kvHeads, context, headDim};
            for (int j = 0; j < 2 * layers; j++) {
                String name = (j % 2 == 0 ? "past_key." : "past_value.") + (j / 2);
                feed.put(name, OnnxTensor.createTensor(env, FloatBuffer.wrap(past[j]), kv));
            }
            OrtSession.Result out = session.run(feed);
            try {
                float[] logits = floats((OnnxTensor) out.get(0));
                for (int j = 0; j < newRows.length; j++) {
                    float[] rows = floats((OnnxTensor) out.get(1 + j));
                    System.arraycopy(rows, 0, newRows[j], 0, newRows[j].length);
                }
                return logits;
            } finally {
                out.close();
            }
        } catch (OrtException e) {
            throw new CoreException("The drafter's QNN graph failed on the NPU: " + e.getMessage(), e);
        } finally {
            for (OnnxTensor t : feed.values()) t.close();
        }
    }

    private static float[] floats(OnnxTensor t) {
        FloatBuffer b = t.getFloatBuffer();
        float[] out = new float[b.remaining()];
        b.get(out);
        return out;
    }

    void close() throws OrtException {
        session.close();
    }
}
