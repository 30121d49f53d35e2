package org.omnidraft.specdecode;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.junit.Test;

/**
 * Replays runs of the Python loop on the bundled pair (export/android_pair_vectors.py): the real
 * drafter and target, every row the loop read kept to its top entries and the rest set to a floor
 * far below them. Python decoded on exactly those rows, so the Java loop must reproduce every call,
 * draft, accept/reject decision, correction/bonus token, committed token, n-gram cache update and
 * the cache file, greedy and sampling alike (same checks as {@link LoopVectorTest}).
 */
public class PairLoopVectorTest {
    static final String FILE = LoopVectorTest.PAIR;
    /** The runs of PAIR_RUNS in export/android_pair_vectors.py; each has its own test below. */
    static final String[] RUNS = {
        "pair-greedy-ngram-code", "pair-sample-ngram-code-chained", "pair-greedy-dm-math", "pair-sample-dm-math",
        "pair-greedy-ngram-text", "pair-sample-ngram-text-chained", "pair-greedy-target-only-text",
    };

    static void check(String name) throws Exception {
        LoopVectorTest.check(FILE, name, null);
    }

    @Test public void greedyNgramCodeRunMatchesPython() throws Exception { check("pair-greedy-ngram-code"); }
    @Test public void samplingNgramCodeRunOnLoadedCacheMatchesPython() throws Exception { check("pair-sample-ngram-code-chained"); }
    @Test public void greedyDirectMapMathRunMatchesPython() throws Exception { check("pair-greedy-dm-math"); }
    @Test public void samplingDirectMapMathRunMatchesPython() throws Exception { check("pair-sample-dm-math"); }
    @Test public void greedyNgramTextRunMatchesPython() throws Exception { check("pair-greedy-ngram-text"); }
    @Test public void samplingNgramTextRunOnLoadedCacheMatchesPython() throws Exception { check("pair-sample-ngram-text-chained"); }
    @Test public void greedyTargetOnlyTextRunMatchesPython() throws Exception { check("pair-greedy-target-only-text"); }

    @Test
    public void everyRecordedRunHasATest() {
        assertEquals("runs in " + FILE + " (add a test for a new run)", Arrays.asList(RUNS), LoopVectorTest.runNames(FILE));
    }

    /** What the issue asks the real-pair runs to show: cache growth and hits, sampling with rejections. */
    @Test
    public void vectorsCoverCacheGrowthHitsAndSampledRejections() {
        int added = 0, hits = 0, sampledRejections = 0, residualDraws = 0, sampledMerged = 0;
        for (Object o : Json.asArray(LoopVectorTest.vectors(FILE).get("runs"), "runs")) {
            Map<String, Object> r = Json.asObject(o, "run");
            Map<String, Object> st = Json.asObject(r.get("stats"), "stats");
            added += ((Long) st.get("ngram_added")).intValue();
            hits += ((Long) st.get("ngram_hits")).intValue();
            Map<String, Object> c = Json.asObject(r.get("config"), "config");
            if (Json.asDouble(c.get("temperature"), "temperature") == 0) continue;
            sampledMerged += ((Long) st.get("ngram_proposed")).intValue();
            for (Object ro : Json.asArray(r.get("rounds"), "rounds")) {
                Map<String, Object> rd = Json.asObject(ro, "round");
                int m = Json.asArray(rd.get("target_ids"), "target_ids").size();
                int j = ((Long) rd.get("accepted")).intValue();
                if (j < m) {
                    sampledRejections++;
                    // draft uniforms + one per tested position + the residual draw
                    int k = Json.asArray(rd.get("draft"), "draft").size();
                    if (Json.asArray(rd.get("uniforms"), "uniforms").size() == k + j + 2) residualDraws++;
                }
            }
        }
        assertTrue("no n-gram added to the cache in the pair runs", added > 0);
        assertTrue("no accepted n-gram (cache hit) in the pair runs", hits > 0);
        assertTrue("no merged proposal in a sampling run", sampledMerged > 0);
        assertTrue("no rejection in a sampling run", sampledRejections > 0);
        assertTrue("no residual draw in a sampling run", residualDraws > 0);
    }

    /**
     * Why the top entries are enough: with the floor stored in the file, softmax at the recorded
     * temperatures gives exactly 0 to every entry that is not stored, so the draws and residuals of
     * the replay are defined over the stored support, and a row has at most top_n stored entries.
     */
    @Test
    public void rowsAreTopEntriesOverAFloorWithZeroProbability() {
        Map<String, Object> v = LoopVectorTest.vectors(FILE);
        int topN = ((Long) v.get("top_n")).intValue();
        int rows = 0;
        for (Object o : Json.asArray(v.get("runs"), "runs")) {
            Map<String, Object> r = Json.asObject(o, "run");
            double temp = Json.asDouble(Json.asObject(r.get("config"), "config").get("temperature"), "temperature");
            for (Object co : Json.asArray(r.get("calls"), "calls")) {
                Map<String, Object> c = Json.asObject(co, "call");
                if (!"forward".equals(c.get("op"))) continue;
                float floor = (float) Json.asDouble(c.get("floor"), "floor");
                int width = ((Long) r.get("drafter".equals(c.get("m")) ? "drafter_width" : "target_width")).intValue();
                for (Object ro : Json.asArray(c.get("rows"), "rows")) {
                    Map<String, Object> row = Json.asObject(ro, "row");
                    int[] idx = TestFiles.ints(row.get("i"));
                    if (idx.length == 0) continue; // a row the loop does not read
                    assertTrue("a row with " + idx.length + " > top_n entries", idx.length <= topN);
                    float[] full = new float[width];
                    Arrays.fill(full, floor);
                    List<Object> val = Json.asArray(row.get("v"), "v");
                    for (int k = 0; k < idx.length; k++) {
                        full[idx[k]] = (float) Json.asDouble(val.get(k), "v");
                        assertTrue("a stored logit at or below the floor", full[idx[k]] > floor);
                    }
                    if (temp > 0) {
                        double[] p = Sampling.softmax(full, temp, null);
                        double off = 0;
                        for (int t = 0; t < width; t++) if (full[t] == floor) off += p[t];
                        assertEquals("probability off the stored support", 0.0, off, 0.0);
                    }
                    rows++;
                }
            }
        }
        assertTrue("no stored rows", rows > 0);
    }
}
