package org.omnidraft.specdecode;

/** Counters of one generation (mirror of the runtime's DecodeStats). */
public final class DecodeStats {
    public int steps; // target calls
    public int proposed; // translated target tokens sent for verification
    public int accepted;
    public int ngramProposed;
    public int ngramHits; // merged n-gram tokens the target accepted
    public int ngramAdded;
    public int drafterCalls;
    public int newTokens;
    public double seconds, drafterSeconds, targetSeconds;

    public double acceptanceRate() {
        return proposed > 0 ? (double) accepted / proposed : 0.0;
    }

    public double tokensPerStep() {
        return steps > 0 ? (double) newTokens / steps : 0.0;
    }

    public double tokensPerSecond() {
        return seconds > 0 ? newTokens / seconds : 0.0;
    }
}
