package org.omnidraft.specdecode;

/**
 * The app's "auto" K: a simple deterministic rule, not the paper's learned acceptance head. K grows
 * by one after a round in which every proposed token was accepted and shrinks by one after a round
 * in which none was, within [min, max].
 */
public final class AutoDraftLength {
    private final int min, max;
    private int k;

    public AutoDraftLength(int start, int min, int max) {
        this.min = min;
        this.max = max;
        this.k = Math.max(min, Math.min(max, start));
    }

    public int current() {
        return k;
    }

    public void update(int proposed, int accepted) {
        if (proposed > 0 && accepted == proposed && proposed >= k) k = Math.min(max, k + 1);
        else if (accepted == 0) k = Math.max(min, k - 1);
    }
}
