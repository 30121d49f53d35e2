package org.omnidraft.specdecode;

import java.util.SplittableRandom;

/** Source of the uniforms in [0, 1) behind every random choice of the loop. */
public abstract class Uniforms {
    public abstract double next();

    /** A seeded generator (the app); runs with the same seed and inputs repeat exactly. */
    public static Uniforms seeded(long seed) {
        final SplittableRandom rng = new SplittableRandom(seed);
        return new Uniforms() {
            @Override
            public double next() {
                return rng.nextDouble();
            }
        };
    }

    /** Uniforms recorded from another run (the Python runtime's numpy generator), replayed in order. */
    public static Uniforms recorded(final double[] values) {
        return new Uniforms() {
            private int i;

            @Override
            public double next() {
                if (i >= values.length) {
                    throw new IllegalStateException("the replay asked for uniform #" + (i + 1) + " but only "
                            + values.length + " were recorded: the Java loop draws more often than the Python one");
                }
                return values[i++];
            }
        };
    }
}
