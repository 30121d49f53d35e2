package org.omnidraft.specdecode;

import java.util.Arrays;

/**
 * A {@link Model} over static graphs of fixed call widths with the KV cache in this class's
 * buffers; mirrors runtime/backends/static_kv.py. A call of n tokens runs on the narrowest width
 * that holds n (padded; the pad rows are dropped and never written), or in chunks of the widest.
 * Rows of hidden positions are cut by an additive bias of {@link #MASK_VALUE}; rollback is a length.
 */
public final class StaticKvModel implements Model {
    /** The bias of a hidden key row (runtime/backends/static_kv.py MASK_VALUE). */
    public static final float MASK_VALUE = -1.0e4f;
    /** A dropped column of a trimmed drafter's rows (runtime/backends/base.py NEG_LOGIT). */
    public static final float NEG_LOGIT = -1e9f;

    private final StaticGraph[] graphs; // by increasing width
    private final int vocab, context, heads, headDim;
    private final int[] kept; // the columns' vocabulary ids of a trimmed drafter, or null
    private final float[][] past;
    private int cached;

    /**
     * {@code kept}: the manifest's draft_vocab.kept (a drafter exported with --draft-vocab), or null
     * when the graphs return every column.
     */
    public StaticKvModel(StaticGraph[] graphs, int vocabSize, int contextLen, int layers, int kvHeads, int headDim, int[] kept) {
        if (graphs.length == 0) throw new IllegalArgumentException("no static graph");
        this.graphs = graphs.clone();
        Arrays.sort(this.graphs, (a, b) -> Integer.compare(a.width(), b.width()));
        this.vocab = vocabSize;
        this.context = contextLen;
        this.heads = kvHeads;
        this.headDim = headDim;
        this.kept = kept;
        this.past = new float[2 * layers][kvHeads * contextLen * headDim];
    }

    @Override public int vocabSize() { return vocab; }
    @Override public int maxSeqLen() { return context; }
    @Override public int cachedLen() { return cached; }

    /** input_ids, position_ids and attention_bias of one call (runtime/backends/static_kv.py feeds). */
    public static float[] attentionBias(int start, int width, int context) {
        int cols = context + width;
        float[] bias = new float[width * cols];
        Arrays.fill(bias, MASK_VALUE);
        for (int r = 0; r < width; r++) {
            Arrays.fill(bias, r * cols, r * cols + start, 0f); // the cached prefix
            Arrays.fill(bias, r * cols + context, r * cols + context + r + 1, 0f); // new rows up to its own
        }
        return bias;
    }

    public static int[] positions(int start, int width, int context) {
        int[] pos = new int[width];
        for (int i = 0; i < width; i++) pos[i] = Math.min(start + i, context - 1);
        return pos;
    }

    private StaticGraph graphFor(int n) {
        for (StaticGraph g : graphs) if (g.width() >= n) return g;
        return graphs[graphs.length - 1];
    }

    @Override
    public float[][] forward(int[] tokens, int startPos) {
        if (startPos != cached) throw new IllegalStateException("forward at " + startPos + " but the cache holds " + cached);
        if (tokens.length == 0 || startPos + tokens.length > context) {
            throw new IllegalStateException("positions " + startPos + ".." + (startPos + tokens.length) + " do not fit the exported context of " + context);
        }
        float[][] rows = new float[tokens.length][];
        int done = 0;
        while (done < tokens.length) {
            StaticGraph g = graphFor(tokens.length - done);
            int n = Math.min(g.width(), tokens.length - done);
            float[][] chunk = call(g, Arrays.copyOfRange(tokens, done, done + n), startPos + done);
            System.arraycopy(chunk, 0, rows, done, n);
            done += n;
        }
        return rows;
    }

    private float[][] call(StaticGraph g, int[] chunk, int start) {
        int w = g.width(), n = chunk.length;
        int[] ids = Arrays.copyOf(chunk, w);
        float[][] fresh = new float[past.length][heads * w * headDim];
        float[] logits;
        try {
            logits = g.run(ids, positions(start, w, context), attentionBias(start, w, context), past, fresh);
        } catch (CoreException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
        for (int j = 0; j < past.length; j++) {
            for (int h = 0; h < heads; h++) {
                System.arraycopy(fresh[j], h * w * headDim, past[j], (h * context + start) * headDim, n * headDim);
            }
        }
        cached = start + n;
        int cols = logits.length / w;
        float[][] rows = new float[n][];
        for (int r = 0; r < n; r++) rows[r] = widen(logits, r * cols, cols);
        return rows;
    }

    private float[] widen(float[] logits, int from, int cols) {
        if (kept == null) return Arrays.copyOfRange(logits, from, from + cols);
        if (cols != kept.length) throw new IllegalStateException("the drafter returned rows of " + cols + " logits, its manifest keeps " + kept.length);
        float[] row = new float[vocab];
        Arrays.fill(row, NEG_LOGIT);
        for (int c = 0; c < cols; c++) row[kept[c]] = logits[from + c];
        return row;
    }

    @Override
    public void rollback(int length) {
        if (length < 0 || length > cached) throw new IllegalStateException("rollback to " + length + " but the cache holds " + cached);
        cached = length; // rows past it stay masked until overwritten
    }

    @Override
    public void reset() {
        cached = 0;
    }
}
