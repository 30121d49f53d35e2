package org.omnidraft.specdecode;

/** Counters of one generation (mirror of the runtime's DecodeStats). */
public final class DecodeStats {
    public int steps; // target calls
    public int proposed; // translated target tokens sent for verification
    public int accepted;
    public int ngramProposed;
    public int ngramHits; // merged n-gram tokens the target accepted
    public int ngramAdded;
    public int lookupRounds, lookupProposed, lookupAccepted; // rounds copied from the context, not drafted
    public int drafterCalls;
    public int newTokens;
    public double seconds, drafterSeconds, targetSeconds;
    public double prefillSeconds; // the target's prompt pass: the same work in every mode

    public double acceptanceRate() {
        return proposed > 0 ? (double) accepted / proposed : 0.0;
    }

    public double tokensPerStep() {
        return steps > 0 ? (double) newTokens / steps : 0.0;
    }

    public double tokensPerSecond() {
        return seconds > 0 ? newTokens / seconds : 0.0;
    }

    /** Tokens per second after the target's prompt pass (the paper's per-step convention). */
    public double decodeTokensPerSecond() {
        double t = seconds - prefillSeconds;
        return t > 0 ? newTokens / t : 0.0;
    }
}
