package org.omnidraft.demo;

import org.omnidraft.specdecode.StaticGraph;
import org.pytorch.executorch.EValue;
import org.pytorch.executorch.Module;
import org.pytorch.executorch.Tensor;

/**
 * One method {@code forward_w<width>} of a static program from {@code omnidraft export
 * --delegate ...} (runtime/backends/executorch_static.py), on whatever backend the program was
 * lowered to, if this app's ExecuTorch library registers it.
 */
final class ExecuTorchStaticGraph implements StaticGraph {
    private final Module module;
    private final String method;
    private final int width, context, kvHeads, headDim;

    ExecuTorchStaticGraph(Module module, String method, int width, int context, int kvHeads, int headDim) {
        this.module = module;
        this.method = method;
        this.width = width;
        this.context = context;
        this.kvHeads = kvHeads;
        this.headDim = headDim;
    }

    @Override public int width() { return width; }

    @Override
    public float[] run(int[] ids, int[] positions, float[] bias, float[][] past, float[][] newRows) {
        EValue[] in = new EValue[3 + past.length];
        in[0] = EValue.from(Tensor.fromBlob(ids, new long[] {1, width}));
        in[1] = EValue.from(Tensor.fromBlob(positions, new long[] {1, width}));
        in[2] = EValue.from(Tensor.fromBlob(bias, new long[] {1, 1, width, context + width}));
        for (int j = 0; j < past.length; j++) {
            in[3 + j] = EValue.from(Tensor.fromBlob(past[j], new long[] {1, kvHeads, context, headDim}));
        }
        EValue[] out = module.execute(method, in);
        for (int j = 0; j < newRows.length; j++) {
            float[] rows = out[1 + j].toTensor().getDataAsFloatArray();
            System.arraycopy(rows, 0, newRows[j], 0, newRows[j].length);
        }
        return out[0].toTensor().getDataAsFloatArray();
    }
}
