package org.omnidraft.specdecode;

import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * Direct mapping between a drafter and a target vocabulary (mirror of {@code runtime/vocab.py}):
 * two tokens map when they spell the same bytes. Special and byte-fallback tokens are left out;
 * the first target id with given bytes wins, and each target id takes the first drafter id.
 */
public final class VocabMap {
    public final int[] d2t; // [drafter width]: target id or -1
    public final int[] t2d; // [target width]: drafter id or -1
    public final int[] drafterIds; // mapped drafter ids, ascending
    public final int[] targetIds; // their target ids, same order
    private final boolean[] dmMask;

    private VocabMap(int[] d2t, int[] t2d) {
        this.d2t = d2t;
        this.t2d = t2d;
        int n = 0;
        for (int t : d2t) if (t >= 0) n++;
        drafterIds = new int[n];
        targetIds = new int[n];
        dmMask = new boolean[d2t.length];
        int k = 0;
        for (int d = 0; d < d2t.length; d++) {
            if (d2t[d] >= 0) {
                drafterIds[k] = d;
                targetIds[k++] = d2t[d];
                dmMask[d] = true;
            }
        }
    }

    /** {@code *Width}: the model's logits width, which may exceed the tokenizer's vocabulary. */
    public static VocabMap build(TokenCodec drafter, TokenCodec target, int drafterWidth, int targetWidth) {
        int dw = Math.max(drafterWidth, drafter.vocabSize());
        int tw = Math.max(targetWidth, target.vocabSize());
        // Bytes as ISO-8859-1 strings: a bijective, hashable key.
        Map<String, Integer> byBytes = new HashMap<String, Integer>(target.vocabSize() * 2);
        for (int tid = 0; tid < target.vocabSize(); tid++) {
            byte[] b = target.tokenBytes(tid);
            if (b.length > 0 && !target.isSpecial(tid) && !target.isByteFallback(tid)) {
                String key = latin1(b);
                if (!byBytes.containsKey(key)) byBytes.put(key, tid);
            }
        }
        int[] d2t = new int[dw];
        int[] t2d = new int[tw];
        Arrays.fill(d2t, -1);
        Arrays.fill(t2d, -1);
        for (int did = 0; did < drafter.vocabSize(); did++) {
            byte[] b = drafter.tokenBytes(did);
            if (b.length == 0 || drafter.isSpecial(did) || drafter.isByteFallback(did)) continue;
            Integer tid = byBytes.get(latin1(b));
            if (tid != null && t2d[tid] < 0) {
                d2t[did] = tid;
                t2d[tid] = did;
            }
        }
        return new VocabMap(d2t, t2d);
    }

    private static String latin1(byte[] b) {
        char[] c = new char[b.length];
        for (int k = 0; k < b.length; k++) c[k] = (char) (b[k] & 0xff);
        return new String(c);
    }

    public int size() {
        return drafterIds.length;
    }

    /** Drafter ids with a direct mapping (shared; do not modify). */
    public boolean[] dmMask() {
        return dmMask;
    }

    /** Scatters a drafter distribution onto the target vocabulary (direct-mapped tokens only). */
    public double[] lift(double[] q, int width) {
        double[] out = new double[width];
        for (int k = 0; k < drafterIds.length; k++) out[targetIds[k]] = q[drafterIds[k]];
        return out;
    }
}
