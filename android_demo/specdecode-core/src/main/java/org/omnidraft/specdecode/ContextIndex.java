package org.omnidraft.specdecode;

import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * Context lookup (mirror of {@code runtime/context_lookup.py}): where the target context's last
 * {@code minNgram..maxNgram} tokens occurred before, the tokens that followed them then are a draft
 * that needs no drafter call and no translation. Each n-gram maps to the position after its latest
 * occurrence; an n-gram is indexed once a token follows it, so the suffix never matches itself.
 */
final class ContextIndex {
    private final int maxTokens, minNgram, maxNgram;
    private final IntList ctx = new IntList();
    private final Map<String, Integer> index = new HashMap<String, Integer>();

    ContextIndex(int maxTokens, int minNgram, int maxNgram, int[] context) {
        this.maxTokens = maxTokens;
        this.minNgram = minNgram;
        this.maxNgram = maxNgram;
        extend(context);
    }

    private String key(int from, int to) {
        return Arrays.toString(ctx.slice(from, to));
    }

    /** Appends committed tokens and indexes every n-gram that a token now follows. */
    void extend(int[] tokens) {
        int start = ctx.size();
        ctx.addAll(tokens);
        for (int end = Math.max(start - 1, 0); end < ctx.size() - 1; end++) {
            for (int n = minNgram; n <= Math.min(maxNgram, end + 1); n++) index.put(key(end - n + 1, end + 1), end + 1);
        }
    }

    /** Up to {@code limit} tokens that followed the longest earlier match of the context's suffix. */
    int[] propose(int limit) {
        int len = ctx.size();
        for (int n = Math.min(maxNgram, len); n >= minNgram; n--) {
            Integer at = index.get(key(len - n, len));
            if (at != null) return ctx.slice(at, Math.min(len, at + Math.min(limit, maxTokens)));
        }
        return new int[0];
    }
}
