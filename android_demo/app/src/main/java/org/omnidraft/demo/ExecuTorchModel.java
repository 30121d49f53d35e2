package org.omnidraft.demo;

import java.io.File;
import org.omnidraft.specdecode.Model;
import org.pytorch.executorch.EValue;
import org.pytorch.executorch.Module;
import org.pytorch.executorch.Tensor;

/**
 * A {@code .pte} from {@code omnidraft export --format executorch}: one method with the KV cache
 * inside the program, either {@code forward(tokens[1,k] int64, input_pos[1] int64)} (ExecuTorch's
 * LLM lowering, the default for Llama/Qwen2) or {@code forward(input_ids[1,k] int64,
 * cache_position[k] int64)} (static-cache lowering), both returning {@code logits[1,k,V] float32}.
 * Writing at position p overwrites cache rows from p on and attention sees only earlier ones, so
 * rollback is bookkeeping (as in runtime/backends/executorch.py).
 *
 * <p>Uses only ExecuTorch's documented Java API: Module.load, Module.forward, EValue.from,
 * EValue.toTensor, Tensor.fromBlob, Tensor.getDataAsFloatArray, Tensor.shape, Module.destroy.
 */
final class ExecuTorchModel implements Model {
    private final Module module;
    private final int vocab, maxSeqLen;
    private final boolean startPositionOnly;
    private int cached;

    ExecuTorchModel(File pte, int vocabSize, int maxSeqLen, boolean startPositionOnly) {
        this.module = Module.load(pte.getAbsolutePath(), Module.LOAD_MODE_MMAP);
        this.vocab = vocabSize;
        this.maxSeqLen = maxSeqLen;
        this.startPositionOnly = startPositionOnly;
    }

    @Override public int vocabSize() { return vocab; }
    @Override public int maxSeqLen() { return maxSeqLen; }
    @Override public int cachedLen() { return cached; }

    @Override
    public float[][] forward(int[] tokens, int startPos) {
        if (startPos != cached) throw new IllegalStateException("forward at " + startPos + " but the cache holds " + cached);
        int k = tokens.length;
        if (k == 0 || startPos + k > maxSeqLen) {
            throw new IllegalStateException("positions " + startPos + ".." + (startPos + k) + " do not fit the exported cache of " + maxSeqLen);
        }
        long[] ids = new long[k];
        for (int i = 0; i < k; i++) ids[i] = tokens[i];
        long[] pos = new long[startPositionOnly ? 1 : k];
        for (int i = 0; i < pos.length; i++) pos[i] = startPos + i;
        EValue[] out = module.forward(
                EValue.from(Tensor.fromBlob(ids, new long[] {1, k})),
                EValue.from(Tensor.fromBlob(pos, new long[] {pos.length})));
        Tensor logits = out[0].toTensor();
        long[] shape = logits.shape();
        int width = (int) shape[shape.length - 1];
        float[] flat = logits.getDataAsFloatArray();
        float[][] rows = new float[k][];
        for (int r = 0; r < k; r++) {
            rows[r] = new float[width];
            System.arraycopy(flat, r * width, rows[r], 0, width);
        }
        cached = startPos + k;
        return rows;
    }

    @Override
    public void rollback(int length) {
        if (length < 0 || length > cached) throw new IllegalStateException("rollback to " + length + " but the cache holds " + cached);
        cached = length;
    }

    @Override
    public void reset() {
        cached = 0;
    }

    void close() {
        module.destroy();
    }
}
