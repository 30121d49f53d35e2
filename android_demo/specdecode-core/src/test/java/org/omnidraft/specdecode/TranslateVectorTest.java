package org.omnidraft.specdecode;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.Test;

/** Eq. 1 (q' of merged n-grams) and Eq. 2 (q' over the target vocabulary) against Python on real vocabularies. */
public class TranslateVectorTest {
    private static double[] dense(Map<String, Object> sparse, int width) {
        double[] out = new double[width];
        List<Object> i = Json.asArray(sparse.get("i"), "i"), v = Json.asArray(sparse.get("v"), "v");
        for (int k = 0; k < i.size(); k++) out[(int) Json.asLong(i.get(k), "i")] = Json.asDouble(v.get(k), "v");
        return out;
    }

    private static List<Map<String, Object>> cases() {
        List<Map<String, Object>> out = new ArrayList<Map<String, Object>>();
        for (Object o : Json.asArray(LoopVectorTest.vectors().get("qprime_cases"), "qprime_cases")) out.add(Json.asObject(o, "case"));
        assertTrue("no q' cases in the vectors", out.size() >= 2);
        return out;
    }

    @Test
    public void eq2PrefixCorrectionMatchesPython() {
        TokenCodec dc = TestFiles.codec("llama-spm"), tc = TestFiles.codec("gpt-2");
        VocabMap vocab = VocabMap.build(dc, tc, dc.vocabSize(), tc.vocabSize());
        int checkedPrefix = 0;
        for (Map<String, Object> c : cases()) {
            NgramCache cache = new NgramCache(dc.sha256, tc.sha256, dc.vocabSize(), null, "lfu");
            int[] key = TestFiles.ints(c.get("key"));
            cache.observe(new NgramCache.Key(key), ((Long) c.get("target")).intValue());
            int[] draft = TestFiles.ints(c.get("draft"));
            List<double[]> qRows = new ArrayList<double[]>();
            for (Object q : Json.asArray(c.get("q_rows"), "q_rows")) qRows.add(dense(Json.asObject(q, "q"), dc.vocabSize()));
            Translate.Translation tr = Translate.translate(draft, vocab, cache);
            assertArrayEquals(c.get("word") + " target ids", TestFiles.ints(c.get("target_ids")), tr.targetIds.toArray());
            List<Object> positions = Json.asArray(c.get("positions"), "positions");
            for (int j = 0; j < positions.size(); j++) {
                Map<String, Object> pos = Json.asObject(positions.get(j), "position");
                double want = Json.asDouble(pos.get("q_prime"), "q_prime");
                assertEquals(c.get("word") + " q'(t_" + j + ")", want, Translate.proposalProb(j, tr, draft, qRows, vocab), 1e-15);
                double[] got = Translate.qPrimeFull(j, tr, draft, qRows, vocab, tc.vocabSize());
                double[] exp = new double[tc.vocabSize()];
                List<Object> fi = Json.asArray(pos.get("full_i"), "full_i"), fv = Json.asArray(pos.get("full_v"), "full_v");
                for (int k = 0; k < fi.size(); k++) exp[(int) Json.asLong(fi.get(k), "i")] = Json.asDouble(fv.get(k), "v");
                assertArrayEquals(c.get("word") + " q' row at " + j, exp, got, 1e-15);
                if (tr.keys.get(j) != null) {
                    // The prefix sub-token gives up exactly the n-gram's product; without Eq. 2 it would not.
                    int i0 = tr.spans.get(j)[0];
                    int prefixT = vocab.d2t[draft[i0]];
                    double prod = 1.0;
                    for (int i = i0; i < tr.spans.get(j)[1]; i++) prod *= qRows.get(i)[draft[i]];
                    double lifted = qRows.get(i0)[draft[i0]];
                    assertEquals("prefix mass", Math.max(0.0, lifted - prod), got[prefixT], 1e-15);
                    assertTrue("Eq. 2 must move mass off the prefix token", Math.abs(exp[prefixT] - lifted) > 1e-6);
                    checkedPrefix++;
                }
            }
        }
        assertTrue("no merged n-gram with a direct-mapped prefix was checked", checkedPrefix > 0);
    }
}
