package org.omnidraft.specdecode;

/**
 * A causal LM with a KV cache (the runtime's backend protocol): it holds the first
 * {@link #cachedLen()} positions of one sequence; the loop feeds tokens at explicit positions and
 * rolls the cache back after a rejection.
 */
public interface Model {
    /** Width of the logits rows. */
    int vocabSize();

    /** Positions the KV cache can hold. */
    int maxSeqLen();

    /** Positions currently held. */
    int cachedLen();

    /**
     * Runs {@code tokens} at positions {@code startPos .. startPos+len-1}; {@code startPos} equals
     * {@link #cachedLen()}. Returns one logits row per token; afterwards cachedLen == startPos + len.
     */
    float[][] forward(int[] tokens, int startPos);

    /** Keeps only the first {@code length} cached positions. */
    void rollback(int length);

    /** Drops the whole cache. */
    void reset();
}
