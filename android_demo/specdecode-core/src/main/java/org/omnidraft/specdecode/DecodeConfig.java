package org.omnidraft.specdecode;

/** Settings of one generation (mirror of the runtime's DecodeConfig; the seed lives in {@link Uniforms}). */
public final class DecodeConfig {
    public static final String NGRAM = "ngram", DM = "dm", TARGET_ONLY = "target-only";

    public int maxNewTokens = 64;
    public double temperature = 0.0;
    /** Draft length K; 0 = adapt K between rounds ({@link AutoDraftLength}, app only). */
    public int draftLen = 4;
    public String mode = NGRAM;
    public int lookbehind = 8;
    /** Context lookup: tokens copied per round at most (0: off), and the suffix lengths that may match. */
    public int lookupMaxTokens = 0;
    public int lookupMinNgram = 2, lookupMaxNgram = 4;

    public void validate() throws InvalidArgumentException {
        if (!NGRAM.equals(mode) && !DM.equals(mode) && !TARGET_ONLY.equals(mode)) {
            throw new InvalidArgumentException("unknown mode '" + mode + "'; choose one of ngram, dm, target-only");
        }
        if (!(temperature >= 0)) {
            throw new InvalidArgumentException("temperature must be >= 0 (got " + temperature + "); use 0 for greedy decoding");
        }
        if (draftLen < 0) throw new InvalidArgumentException("draft length K must be >= 1, or 0 for auto (got " + draftLen + ")");
        if (maxNewTokens < 1) throw new InvalidArgumentException("max new tokens must be >= 1 (got " + maxNewTokens + ")");
        if (lookbehind < 1) throw new InvalidArgumentException("lookbehind must be >= 1 (got " + lookbehind + ")");
        if (lookupMaxTokens < 0) throw new InvalidArgumentException("context lookup tokens must be >= 0 (got " + lookupMaxTokens + "); 0 turns it off");
        if (lookupMaxTokens > 0 && (lookupMinNgram < 1 || lookupMaxNgram < lookupMinNgram)) {
            throw new InvalidArgumentException("context lookup n-grams must satisfy 1 <= min <= max (got "
                    + lookupMinNgram + "-" + lookupMaxNgram + ")");
        }
    }
}
