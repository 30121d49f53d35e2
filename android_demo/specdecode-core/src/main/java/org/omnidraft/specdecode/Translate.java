package org.omnidraft.specdecode;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * Translation between drafter and target token spaces (mirror of {@code runtime/translate.py}):
 * greedy longest match of cached n-grams else the direct map, the proposal probability q' (Eq. 1),
 * q' over the whole target vocabulary with the Eq. 2 prefix correction, and n-gram harvesting.
 */
public final class Translate {
    private Translate() {}

    /** m target tokens translated from k drafter tokens. */
    public static final class Translation {
        public final IntList targetIds = new IntList();
        public final List<int[]> spans = new ArrayList<int[]>(); // drafter positions [i, j)
        public final List<NgramCache.Key> keys = new ArrayList<NgramCache.Key>(); // cache key when merged, else null

        public int size() {
            return targetIds.size();
        }
    }

    /** Maps drafter tokens to target tokens; stops at the first drafter token that has neither a cached n-gram nor a direct mapping. */
    public static Translation translate(int[] draft, VocabMap vocab, NgramCache cache) {
        Translation out = new Translation();
        int i = 0, k = draft.length;
        while (i < k) {
            int hitN = 0, hitT = -1;
            NgramCache.Key hitKey = null;
            if (cache != null && cache.size() > 0) {
                for (int n = Math.min(cache.maxLen(), k - i); n > 0; n--) {
                    NgramCache.Key key = new NgramCache.Key(Arrays.copyOfRange(draft, i, i + n));
                    int t = cache.get(key);
                    if (t >= 0) {
                        hitN = n;
                        hitT = t;
                        hitKey = key;
                        break;
                    }
                }
            }
            if (hitKey != null) {
                out.targetIds.add(hitT);
                out.spans.add(new int[] {i, i + hitN});
                out.keys.add(hitKey);
                i += hitN;
            } else if (vocab.d2t[draft[i]] >= 0) {
                out.targetIds.add(vocab.d2t[draft[i]]);
                out.spans.add(new int[] {i, i + 1});
                out.keys.add(null);
                i += 1;
            } else {
                break; // untranslatable: the proposal ends here
            }
        }
        return out;
    }

    /**
     * q'(t_j): drafter probability of proposing target token j (Eq. 1). Direct: q(d). Merged n-gram:
     * prod q(d_i) over its sub-tokens, plus q of a drafter token mapping to the same target directly.
     */
    public static double proposalProb(int j, Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab) {
        int i0 = tr.spans.get(j)[0], i1 = tr.spans.get(j)[1];
        if (tr.keys.get(j) == null) return qRows.get(i0)[draft[i0]];
        double prod = 1.0;
        for (int i = i0; i < i1; i++) prod *= qRows.get(i)[draft[i]];
        int alias = vocab.t2d[tr.targetIds.get(j)];
        return prod + (alias >= 0 && alias != draft[i0] ? qRows.get(i0)[alias] : 0.0);
    }

    /**
     * q' over the whole target vocabulary at translated position j (Eq. 2): direct tokens carry their
     * drafter probability, unmapped ones 0; for an n-gram drafted this round the n-gram gets the
     * product and its prefix sub-token keeps q(d1) - product.
     */
    public static double[] qPrimeFull(int j, Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab, int targetWidth) {
        int i0 = tr.spans.get(j)[0];
        double[] q = qRows.get(i0);
        double[] full = vocab.lift(q, targetWidth);
        if (tr.keys.get(j) != null) {
            int t = tr.targetIds.get(j);
            double prod = proposalProb(j, tr, draft, qRows, vocab)
                    - (vocab.t2d[t] >= 0 && vocab.t2d[t] != draft[i0] ? full[t] : 0.0);
            full[t] += prod;
            int prefixT = vocab.d2t[draft[i0]];
            if (prefixT >= 0) full[prefixT] = Math.max(0.0, full[prefixT] - prod);
        }
        return full;
    }

    /**
     * Inserts (drafter sub-tokens -> target token) for accepted target tokens spelled exactly by
     * drafter tokens of the re-tokenized window. {@code window}: drafter (id, start, end);
     * {@code targetSpans}: accepted target (id, start, end). Returns the number of new entries.
     */
    public static int harvestNgrams(List<int[]> window, List<int[]> targetSpans, VocabMap vocab, NgramCache cache) {
        java.util.HashMap<Integer, Integer> byStart = new java.util.HashMap<Integer, Integer>();
        for (int n = 0; n < window.size(); n++) byStart.put(window.get(n)[1], n);
        int added = 0;
        for (int[] ts : targetSpans) {
            int t = ts[0], a = ts[1], b = ts[2];
            Integer n = byStart.get(a);
            if (n == null || a == b) continue;
            int m = n;
            while (m < window.size() && window.get(m)[2] < b) m++;
            if (m >= window.size() || window.get(m)[2] != b) continue;
            int[] ids = new int[m - n + 1];
            for (int i = n; i <= m; i++) ids[i - n] = window.get(i)[0];
            if (ids.length == 1 && vocab.d2t[ids[0]] == t) continue;
            if (ids.length == 1 && vocab.d2t[ids[0]] >= 0) continue; // a direct-mapped drafter token keeps its meaning
            if (cache.observe(new NgramCache.Key(ids), t)) added++;
        }
        return added;
    }
}
