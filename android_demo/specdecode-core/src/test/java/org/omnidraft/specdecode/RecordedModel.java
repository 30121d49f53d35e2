package org.omnidraft.specdecode;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.fail;

import java.util.Arrays;
import java.util.List;
import java.util.Map;

/**
 * A {@link Model} that replays one model's side of a recorded Python run: every forward, rollback
 * and reset must come in the recorded order with the recorded arguments, and forward returns the
 * exact rows Python saw (floor everywhere except the recorded entries).
 */
final class RecordedModel implements Model {
    private final String tag;
    private final List<Map<String, Object>> calls; // all calls of the run, both models
    private final int[] cursor; // shared position in the interleaved call log
    private final int width, maxSeqLen;
    private int cached;

    RecordedModel(String tag, List<Map<String, Object>> calls, int[] cursor, int width, int maxSeqLen) {
        this.tag = tag;
        this.calls = calls;
        this.cursor = cursor;
        this.width = width;
        this.maxSeqLen = maxSeqLen;
    }

    private Map<String, Object> next(String op) {
        if (cursor[0] >= calls.size()) fail(tag + "." + op + " called after the recorded run ended (call #" + cursor[0] + ")");
        Map<String, Object> c = calls.get(cursor[0]);
        if (!tag.equals(c.get("m")) || !op.equals(c.get("op"))) {
            fail("call #" + cursor[0] + ": Java made " + tag + "." + op + " but Python made " + c.get("m") + "." + c.get("op"));
        }
        cursor[0]++;
        return c;
    }

    @Override public int vocabSize() { return width; }
    @Override public int maxSeqLen() { return maxSeqLen; }
    @Override public int cachedLen() { return cached; }

    @Override
    public float[][] forward(int[] tokens, int startPos) {
        int at = cursor[0];
        Map<String, Object> c = next("forward");
        assertEquals("call #" + at + " " + tag + " start position", ((Long) c.get("start")).intValue(), startPos);
        int[] want = TestFiles.ints(c.get("tokens"));
        if (!Arrays.equals(want, tokens)) {
            fail("call #" + at + " " + tag + " tokens: Python fed " + Arrays.toString(want) + ", Java " + Arrays.toString(tokens));
        }
        float floor = (float) Json.asDouble(c.get("floor"), "floor");
        List<Object> rows = Json.asArray(c.get("rows"), "rows");
        float[][] out = new float[rows.size()][width];
        for (int r = 0; r < out.length; r++) {
            Arrays.fill(out[r], floor);
            Map<String, Object> row = Json.asObject(rows.get(r), "row");
            List<Object> idx = Json.asArray(row.get("i"), "i"), val = Json.asArray(row.get("v"), "v");
            for (int k = 0; k < idx.size(); k++) out[r][(int) Json.asLong(idx.get(k), "i")] = (float) Json.asDouble(val.get(k), "v");
        }
        cached = startPos + tokens.length;
        return out;
    }

    @Override
    public void rollback(int length) {
        int at = cursor[0];
        Map<String, Object> c = next("rollback");
        assertEquals("call #" + at + " " + tag + " rollback length", ((Long) c.get("length")).intValue(), length);
        cached = length;
    }

    @Override
    public void reset() {
        next("reset");
        cached = 0;
    }
}
