package org.omnidraft.specdecode;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;

import java.util.Arrays;
import java.util.HashSet;
import java.util.Map;
import org.junit.Test;

/** The static-KV model: masks, padded and chunked calls, cache writes, rollback, and the drafter choice. */
public class StaticKvModelTest {
    /**
     * One layer, one head, head size 1: a key row holds its token id. Column 0 of a logits row is the
     * sum of every key the row may see (bias 0), column 1 its position, so a row at position p must
     * read the sum of the sequence's tokens 0..p whatever the chunking, padding and rollbacks.
     */
    private static final class SumGraph implements StaticGraph {
        final int width, context;
        int calls;

        SumGraph(int width, int context) {
            this.width = width;
            this.context = context;
        }

        @Override public int width() { return width; }

        @Override
        public float[] run(int[] ids, int[] positions, float[] bias, float[][] past, float[][] newRows) {
            calls++;
            int cols = context + width;
            float[] logits = new float[width * 2];
            for (int r = 0; r < width; r++) {
                float sum = 0;
                for (int c = 0; c < context; c++) if (bias[r * cols + c] == 0f) sum += past[0][c];
                for (int c = 0; c < width; c++) if (bias[r * cols + context + c] == 0f) sum += ids[c];
                logits[2 * r] = sum;
                logits[2 * r + 1] = positions[r];
                newRows[0][r] = ids[r];
                newRows[1][r] = -ids[r];
            }
            return logits;
        }
    }

    private static void assertPrefixSums(int[] seq, int start, float[][] rows) {
        for (int r = 0; r < rows.length; r++) {
            int want = 0;
            for (int i = 0; i <= start + r; i++) want += seq[i];
            assertEquals("row at " + (start + r), want, rows[r][0], 0f);
            assertEquals(start + r, rows[r][1], 0f);
        }
    }

    @Test
    public void rowsSeeExactlyTheirPrefixThroughPaddingChunksAndRollback() {
        SumGraph one = new SumGraph(1, 16), four = new SumGraph(4, 16);
        StaticKvModel m = new StaticKvModel(new StaticGraph[] {four, one}, 2, 16, 1, 1, 1, null);
        int[] seq = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
        assertPrefixSums(seq, 0, m.forward(Arrays.copyOfRange(seq, 0, 6), 0)); // a width-4 chunk, then 2 padded
        assertEquals(2, four.calls);
        assertPrefixSums(seq, 6, m.forward(new int[] {seq[6]}, 6)); // one token: the width-1 graph
        assertEquals(1, one.calls);
        m.rollback(4);
        seq[4] = 7; // a rejected suffix is overwritten
        seq[5] = 8;
        assertPrefixSums(seq, 4, m.forward(new int[] {7, 8, seq[6]}, 4));
        assertEquals(7, m.cachedLen());
    }

    @Test
    public void theBiasMatchesThePythonRuntimesFeeds() {
        float x = StaticKvModel.MASK_VALUE;
        // runtime/backends/static_kv.py feeds([7, 8], 3, 4, 10): rows see positions 0..2 and new rows up to their own.
        float[] bias = StaticKvModel.attentionBias(3, 4, 10);
        float[] row2 = Arrays.copyOfRange(bias, 2 * 14, 3 * 14);
        assertArrayEquals(new float[] {0, 0, 0, x, x, x, x, x, x, x, 0, 0, 0, x}, row2, 0f);
        assertArrayEquals(new int[] {8, 9, 9, 9}, StaticKvModel.positions(8, 4, 10));
    }

    @Test
    public void aTrimmedDraftersColumnsAreWidenedToTheVocabulary() {
        StaticKvModel m = new StaticKvModel(new StaticGraph[] {new SumGraph(1, 8)}, 5, 8, 1, 1, 1, new int[] {1, 3});
        float[] row = m.forward(new int[] {2}, 0)[0];
        assertArrayEquals(new float[] {StaticKvModel.NEG_LOGIT, 2f, StaticKvModel.NEG_LOGIT, 0f, StaticKvModel.NEG_LOGIT}, row, 0f);
    }

    @Test
    public void theDrafterChoiceNamesWhereItRunsAndWhatThisBuildLacks() {
        HashSet<String> xnnpack = new HashSet<String>(Arrays.asList("XnnpackBackend"));
        Map<String, Object> qnn = Json.asObject(Json.parse("{\"format\":\"onnx\",\"device\":\"qnn-htp\",\"quant\":\"fp16\","
                + "\"device_info\":{\"soc\":\"SM8650\"}}"), "m");
        DrafterChoice c = DrafterChoice.of(qnn, xnnpack, true);
        assertEquals(DrafterChoice.Runtime.ORT_QNN, c.runtime);
        assertEquals("Hexagon NPU (QNN HTP, SM8650, fp16)", c.label);
        assertNull(c.unavailable);
        assertTrue(DrafterChoice.of(qnn, xnnpack, false).unavailable.contains("no ONNX Runtime QNN"));
        Map<String, Object> pte = Json.asObject(Json.parse("{\"format\":\"executorch\",\"device\":\"cpu\"}"), "m");
        assertEquals("CPU (ExecuTorch XNNPACK)", DrafterChoice.of(pte, xnnpack, false).label);
        Map<String, Object> vk = Json.asObject(Json.parse("{\"format\":\"executorch\",\"device\":\"vulkan\","
                + "\"device_info\":{\"delegate\":\"vulkan\",\"backend_id\":\"VulkanBackend\",\"targets\":\"GPU (Vulkan)\"}}"), "m");
        DrafterChoice v = DrafterChoice.of(vk, xnnpack, true);
        assertEquals(DrafterChoice.Runtime.EXECUTORCH_STATIC, v.runtime);
        assertEquals("GPU (Vulkan) (ExecuTorch vulkan)", v.label);
        assertTrue(v.unavailable.contains("has no VulkanBackend"));
        assertNull(DrafterChoice.of(vk, new HashSet<String>(Arrays.asList("XnnpackBackend", "VulkanBackend")), false).unavailable);
        Map<String, Object> cpuOnnx = Json.asObject(Json.parse("{\"format\":\"onnx\",\"device\":\"cpu\"}"), "m");
        assertTrue(DrafterChoice.of(cpuOnnx, xnnpack, true).unavailable.contains("does not run in this app"));
    }
}
