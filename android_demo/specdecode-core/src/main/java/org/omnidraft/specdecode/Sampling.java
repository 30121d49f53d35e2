package org.omnidraft.specdecode;

/**
 * Distributions and draws (mirror of {@code runtime/sampling.py}). Every random draw takes an
 * explicit uniform, so a run replays exactly from recorded uniforms.
 */
public final class Sampling {
    private Sampling() {}

    /** float64 distribution of {@code logits / temperature}; tokens outside {@code mask} get 0. */
    public static double[] softmax(float[] logits, double temperature, boolean[] mask) {
        int n = logits.length;
        double[] z = new double[n];
        double max = Double.NEGATIVE_INFINITY;
        for (int i = 0; i < n; i++) {
            z[i] = (mask != null && !mask[i]) ? Double.NEGATIVE_INFINITY : logits[i] / temperature;
            if (z[i] > max) max = z[i];
        }
        for (int i = 0; i < n; i++) z[i] = StrictMath.exp(z[i] - max);
        double s = pairwiseSum(z, 0, n);
        for (int i = 0; i < n; i++) z[i] /= s;
        return z;
    }

    /** First index of the largest logit among {@code mask} (numpy's argmax; masked-out count as -inf). */
    public static int maskedArgmax(float[] logits, boolean[] mask) {
        int best = 0;
        float bv = (mask != null && !mask[0]) ? Float.NEGATIVE_INFINITY : logits[0];
        for (int i = 1; i < logits.length; i++) {
            float v = (mask != null && !mask[i]) ? Float.NEGATIVE_INFINITY : logits[i];
            if (v > bv) {
                bv = v;
                best = i;
            }
        }
        return best;
    }

    public static int argmax(float[] logits) {
        return maskedArgmax(logits, null);
    }

    /** Inverse-CDF draw from a (possibly unnormalised) non-negative vector, as numpy's searchsorted(side="right"). */
    public static int draw(double[] p, double u) {
        int n = p.length;
        double[] c = new double[n];
        double acc = 0;
        for (int i = 0; i < n; i++) {
            acc += p[i];
            c[i] = acc;
        }
        double target = u * c[n - 1];
        int lo = 0, hi = n; // first index with c[i] > target
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (c[mid] <= target) lo = mid + 1;
            else hi = mid;
        }
        return Math.min(lo, n - 1);
    }

    /** norm(max(0, p - q')); falls back to p when q' covers p everywhere. */
    public static double[] residual(double[] p, double[] qPrime) {
        int n = p.length;
        double[] r = new double[n];
        for (int i = 0; i < n; i++) r[i] = Math.max(p[i] - qPrime[i], 0.0);
        double s = pairwiseSum(r, 0, n);
        if (!(s > 1e-12)) return p;
        for (int i = 0; i < n; i++) r[i] /= s;
        return r;
    }

    /** numpy's pairwise summation of float64 (blocks of 128, eight accumulators), so sums agree bit for bit. */
    static double pairwiseSum(double[] a, int from, int n) {
        if (n < 8) {
            double res = 0.0;
            for (int i = 0; i < n; i++) res += a[from + i];
            return res;
        } else if (n <= 128) {
            double r0 = a[from], r1 = a[from + 1], r2 = a[from + 2], r3 = a[from + 3];
            double r4 = a[from + 4], r5 = a[from + 5], r6 = a[from + 6], r7 = a[from + 7];
            int i;
            for (i = 8; i < n - (n % 8); i += 8) {
                r0 += a[from + i];
                r1 += a[from + i + 1];
                r2 += a[from + i + 2];
                r3 += a[from + i + 3];
                r4 += a[from + i + 4];
                r5 += a[from + i + 5];
                r6 += a[from + i + 6];
                r7 += a[from + i + 7];
            }
            double res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7));
            for (; i < n; i++) res += a[from + i];
            return res;
        } else {
            int n2 = n / 2;
            n2 -= n2 % 8;
            return pairwiseSum(a, from, n2) + pairwiseSum(a, from + n2, n - n2);
        }
    }
}
