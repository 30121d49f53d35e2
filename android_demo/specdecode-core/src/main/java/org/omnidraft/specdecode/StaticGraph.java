package org.omnidraft.specdecode;

/**
 * One compiled static-shape graph of a fixed call width (export/static_graph.py): inputs
 * {@code input_ids[1,w]}, {@code position_ids[1,w]} (int32), {@code attention_bias[1,1,w,C+w]} and
 * {@code past_key.i / past_value.i [1,H,C,D]}; outputs {@code logits[1,w,V]} and the call's new rows
 * {@code new_key.i / new_value.i [1,H,w,D]}. The app implements it on a runtime (ONNX Runtime with
 * QNN's HTP, an ExecuTorch delegate); {@link StaticKvModel} owns the cache around it.
 */
public interface StaticGraph {
    /** Tokens per call. */
    int width();

    /**
     * Runs one call. {@code past[j]} is buffer j in input order (key 0, value 0, key 1, ...), flat
     * row-major {@code [H,C,D]}. Returns the logits, flat {@code [w, columns]}, and writes the new
     * rows of buffer j, flat {@code [H,w,D]}, into {@code newRows[j]}.
     */
    float[] run(int[] ids, int[] positions, float[] attentionBias, float[][] past, float[][] newRows) throws CoreException;
}
