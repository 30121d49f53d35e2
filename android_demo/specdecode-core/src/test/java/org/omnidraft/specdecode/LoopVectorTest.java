package org.omnidraft.specdecode;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.io.File;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.Test;

/**
 * Replays whole speculative runs of the Python runtime (export/android_loop_vectors.py) through the
 * Java loop with recorded models and recorded uniforms. Every model call, rollback, draft,
 * translation, accept/reject decision, correction/bonus token, committed token, n-gram cache update
 * and the final cache file bytes must match exactly.
 */
public class LoopVectorTest {
    /** Runs of the scripted pair (no weights; see export/android_loop_vectors.py). */
    static final String SCRIPTED = "loop-llama-spm-gpt-2.json";
    /** Runs of the bundled pair with rows kept to their top entries (export/android_pair_vectors.py). */
    static final String PAIR = "loop-bundled-pair.json";

    static Map<String, Object> vectors() {
        return vectors(SCRIPTED);
    }

    static Map<String, Object> vectors(String file) {
        return Json.asObject(TestFiles.vectors(file), "loop vectors " + file);
    }

    static Map<String, Object> run(String name) {
        return run(SCRIPTED, name);
    }

    static Map<String, Object> run(String file, String name) {
        for (Object o : Json.asArray(vectors(file).get("runs"), "runs")) {
            Map<String, Object> r = Json.asObject(o, "run");
            if (name.equals(r.get("name"))) return r;
        }
        throw new AssertionError("no run named " + name + " in " + file + "; regenerate them with `omnidraft android-vectors`");
    }

    static double[] doubles(Object list) {
        List<Object> l = Json.asArray(list, "doubles");
        double[] out = new double[l.size()];
        for (int i = 0; i < out.length; i++) out[i] = Json.asDouble(l.get(i), "double");
        return out;
    }

    /** Runs the Java loop on the recorded run; {@code decoderFactory} lets a test swap in a broken rule. */
    static SpeculativeDecoder.Result replay(String file, Map<String, Object> r, SpeculativeDecoder.AcceptanceRule rule) throws Exception {
        TokenCodec drafterCodec = TestFiles.codec("llama-spm"), targetCodec = TestFiles.codec("gpt-2");
        Map<String, Object> v = vectors(file);
        assertEquals("drafter tokenizer of the vectors", v.get("drafter_tokenizer"), drafterCodec.sha256);
        assertEquals("target tokenizer of the vectors", v.get("target_tokenizer"), targetCodec.sha256);
        @SuppressWarnings("unchecked")
        List<Map<String, Object>> calls = (List<Map<String, Object>>) (List<?>) Json.asArray(r.get("calls"), "calls");
        int[] cursor = {0};
        Map<String, Object> msl = Json.asObject(r.get("max_seq_len"), "max_seq_len");
        int dw = ((Long) r.get("drafter_width")).intValue(), tw = ((Long) r.get("target_width")).intValue();
        RecordedModel drafter = new RecordedModel("drafter", calls, cursor, dw, ((Long) msl.get("drafter")).intValue());
        RecordedModel target = new RecordedModel("target", calls, cursor, tw, ((Long) msl.get("target")).intValue());
        Map<String, Object> before = Json.asObject(Json.parse((String) r.get("cache_before")), "cache_before");
        NgramCache cache;
        if (r.get("cache_file") == null) {
            Object cap = before.get("capacity");
            cache = new NgramCache(drafterCodec.sha256, targetCodec.sha256, dw, cap == null ? null : ((Long) cap).intValue(),
                    (String) before.get("policy"));
        } else {
            // A cache saved by Python, loaded by Java: same entries, order, clock and eviction state.
            File f = File.createTempFile("ngram-cache", ".json");
            f.deleteOnExit();
            Files8.writeAtomic(f, ((String) r.get("cache_file")).getBytes(Utf8.UTF8));
            cache = NgramCache.load(f, drafterCodec.sha256, targetCodec.sha256, dw, tw, null, null);
        }
        assertEquals("n-gram cache before the run", r.get("cache_before"), new String(cache.serialise(), Utf8.UTF8));
        Set<Integer> eos = new HashSet<Integer>();
        for (int e : TestFiles.ints(r.get("target_eos"))) eos.add(e);
        SpeculativeDecoder dec = new SpeculativeDecoder(target, targetCodec, eos, drafter, drafterCodec, cache);
        if (rule != null) dec.setAcceptanceRule(rule);
        Map<String, Object> c = Json.asObject(r.get("config"), "config");
        DecodeConfig cfg = new DecodeConfig();
        cfg.maxNewTokens = ((Long) c.get("max_new_tokens")).intValue();
        cfg.temperature = Json.asDouble(c.get("temperature"), "temperature");
        cfg.draftLen = ((Long) c.get("draft_len")).intValue();
        cfg.mode = (String) c.get("mode");
        cfg.lookbehind = ((Long) c.get("lookbehind")).intValue();
        if (c.get("lookup") != null) {
            Map<String, Object> lk = Json.asObject(c.get("lookup"), "lookup");
            cfg.lookupMaxTokens = ((Long) lk.get("max_tokens")).intValue();
            cfg.lookupMinNgram = ((Long) lk.get("min_ngram")).intValue();
            cfg.lookupMaxNgram = ((Long) lk.get("max_ngram")).intValue();
        }
        double[] us = doubles(r.get("uniforms"));
        final int[] used = {0};
        final Uniforms rec = Uniforms.recorded(us);
        Uniforms counting = new Uniforms() {
            @Override
            public double next() {
                used[0]++;
                return rec.next();
            }
        };
        SpeculativeDecoder.Result res = dec.generate((String) r.get("prompt"), cfg, counting, null, true);
        assertEquals("uniforms drawn", us.length, used[0]);
        assertEquals("model calls made (of " + calls.size() + " recorded)", calls.size(), cursor[0]);
        return new ReplayOutcome(res, cache).result();
    }

    /** Holder so a test can also reach the cache after the run. */
    static final class ReplayOutcome {
        static NgramCache lastCache;
        final SpeculativeDecoder.Result res;

        ReplayOutcome(SpeculativeDecoder.Result res, NgramCache cache) {
            this.res = res;
            lastCache = cache;
        }

        SpeculativeDecoder.Result result() {
            return res;
        }
    }

    static void check(String name) throws Exception {
        check(SCRIPTED, name, null);
    }

    static void check(String name, SpeculativeDecoder.AcceptanceRule rule) throws Exception {
        check(SCRIPTED, name, rule);
    }

    static void check(String file, String name, SpeculativeDecoder.AcceptanceRule rule) throws Exception {
        Map<String, Object> r = run(file, name);
        SpeculativeDecoder.Result res = replay(file, r, rule);
        List<Object> rounds = Json.asArray(r.get("rounds"), "rounds");
        assertEquals("rounds", rounds.size(), res.rounds.size());
        for (int i = 0; i < rounds.size(); i++) {
            Map<String, Object> want = Json.asObject(rounds.get(i), "round");
            SpeculativeDecoder.Round got = res.rounds.get(i);
            String at = "round " + i + " ";
            assertArrayEquals(at + "draft", TestFiles.ints(want.get("draft")), got.draft);
            assertArrayEquals(at + "target ids", TestFiles.ints(want.get("target_ids")), got.targetIds);
            List<Object> spans = Json.asArray(want.get("spans"), "spans");
            assertEquals(at + "spans", spans.size(), got.spans.length);
            for (int s = 0; s < spans.size(); s++) assertArrayEquals(at + "span " + s, TestFiles.ints(spans.get(s)), got.spans[s]);
            List<Object> merged = Json.asArray(want.get("merged"), "merged");
            for (int s = 0; s < merged.size(); s++) assertEquals(at + "merged " + s, merged.get(s), got.merged[s]);
            assertEquals(at + "accepted", ((Long) want.get("accepted")).intValue(), got.accepted);
            assertEquals(at + "correction/bonus token", ((Long) want.get("extra")).intValue(), got.extra);
            assertArrayEquals(at + "committed", TestFiles.ints(want.get("committed")), got.committed);
            assertArrayEquals(at + "uniforms", doubles(want.get("uniforms")), got.uniforms, 0.0);
            assertEquals(at + "n-grams added", ((Long) want.get("ngram_added")).intValue(), got.ngramAdded);
            assertEquals(at + "drafter cache kept", ((Long) want.get("drafter_cache_kept")).intValue(), got.drafterCacheKept);
            if (want.containsKey("context")) {
                assertArrayEquals(at + "drafter context", TestFiles.ints(want.get("context")), got.context);
            }
        }
        assertArrayEquals("token ids", TestFiles.ints(r.get("token_ids")), res.tokenIds);
        assertEquals("text", r.get("text"), res.text);
        Map<String, Object> st = Json.asObject(r.get("stats"), "stats");
        assertEquals("steps", ((Long) st.get("steps")).intValue(), res.stats.steps);
        assertEquals("proposed", ((Long) st.get("proposed")).intValue(), res.stats.proposed);
        assertEquals("accepted", ((Long) st.get("accepted")).intValue(), res.stats.accepted);
        assertEquals("ngram proposed", ((Long) st.get("ngram_proposed")).intValue(), res.stats.ngramProposed);
        assertEquals("ngram hits", ((Long) st.get("ngram_hits")).intValue(), res.stats.ngramHits);
        assertEquals("ngram added", ((Long) st.get("ngram_added")).intValue(), res.stats.ngramAdded);
        assertEquals("drafter calls", ((Long) st.get("drafter_calls")).intValue(), res.stats.drafterCalls);
        assertEquals("rounds copied from the context", ((Long) st.get("lookup_rounds")).intValue(), res.stats.lookupRounds);
        assertEquals("copied tokens accepted", ((Long) st.get("lookup_accepted")).intValue(), res.stats.lookupAccepted);
        assertEquals("new tokens", ((Long) st.get("new_tokens")).intValue(), res.stats.newTokens);
        assertEquals("n-gram cache file after the run", r.get("cache_after"), new String(ReplayOutcome.lastCache.serialise(), Utf8.UTF8));
    }

    @Test public void greedyNgramRunMatchesPython() throws Exception { check("greedy-ngram"); }
    @Test public void samplingNgramRunWithLoadedCacheMatchesPython() throws Exception { check("sample-ngram-chained"); }
    @Test public void samplingDirectMapRunMatchesPython() throws Exception { check("sample-dm"); }
    @Test public void greedyTargetOnlyRunMatchesPython() throws Exception { check("greedy-target-only"); }
    @Test public void samplingLfuBoundedCacheRunMatchesPython() throws Exception { check("sample-ngram-lfu-capacity"); }
    @Test public void samplingLruBoundedCacheUnicodeRunMatchesPython() throws Exception { check("sample-ngram-lru-capacity"); }
    @Test public void greedyUnicodeRunMatchesPython() throws Exception { check("greedy-ngram-unicode"); }
    @Test public void samplingHotTemperatureRunMatchesPython() throws Exception { check("sample-ngram-hot"); }
    @Test public void greedyWarmCacheRunMatchesPython() throws Exception { check("greedy-ngram-warm"); }
    @Test public void samplingRejectionsOnMergedNgramsMatchPython() throws Exception { check("sample-ngram-eq2"); }
    @Test public void greedyContextLookupRunMatchesPython() throws Exception { check("greedy-ngram-lookup"); }
    @Test public void samplingContextLookupRunMatchesPython() throws Exception { check("sample-dm-lookup"); }

    @Test
    public void vectorsCoverMergedTokensHitsAndRejections() {
        int hits = 0, merged = 0, rejections = 0, evictionRuns = 0, copiedAccepted = 0, copiedRejected = 0;
        for (Object o : Json.asArray(vectors().get("runs"), "runs")) {
            Map<String, Object> r = Json.asObject(o, "run");
            Map<String, Object> st = Json.asObject(r.get("stats"), "stats");
            hits += ((Long) st.get("ngram_hits")).intValue();
            merged += ((Long) st.get("ngram_proposed")).intValue();
            rejections += ((Long) st.get("proposed")).intValue() - ((Long) st.get("accepted")).intValue();
            Map<String, Object> after = Json.asObject(Json.parse((String) r.get("cache_after")), "cache");
            copiedAccepted += ((Long) st.get("lookup_accepted")).intValue();
            copiedRejected += ((Long) st.get("lookup_proposed")).intValue() - ((Long) st.get("lookup_accepted")).intValue();
            if (after.get("capacity") != null && ((Long) st.get("ngram_added")) > ((Long) after.get("capacity"))) evictionRuns++;
        }
        assertTrue("no accepted n-gram in the vectors", hits > 0);
        assertTrue("no merged proposal in the vectors", merged > 0);
        assertTrue("no rejection in the vectors", rejections > 0);
        assertTrue("no eviction in the vectors", evictionRuns > 0);
        assertTrue("no accepted copied token in the vectors", copiedAccepted > 0);
        assertTrue("no rejected copied token in the vectors", copiedRejected > 0);
    }

    static List<String> runNames(String file) {
        List<String> out = new ArrayList<String>();
        for (Object o : Json.asArray(vectors(file).get("runs"), "runs")) out.add((String) Json.asObject(o, "run").get("name"));
        return out;
    }

    /** Replays every sampling run of the scripted vectors with {@code rule}; at least one must notice. */
    static List<String> expectFailure(SpeculativeDecoder.AcceptanceRule rule) throws Exception {
        return expectFailure(SCRIPTED, rule);
    }

    /** Replays every sampling run of {@code file} with {@code rule}; at least one must notice. Returns the runs that did. */
    static List<String> expectFailure(String file, SpeculativeDecoder.AcceptanceRule rule) throws Exception {
        List<String> caught = new ArrayList<String>();
        for (String name : runNames(file)) {
            Map<String, Object> r = run(file, name);
            Map<String, Object> c = Json.asObject(r.get("config"), "config");
            if (Json.asDouble(c.get("temperature"), "temperature") == 0 || DecodeConfig.TARGET_ONLY.equals(c.get("mode"))) continue;
            try {
                check(file, name, rule);
            } catch (AssertionError e) {
                caught.add(name); // the replay noticed
            } catch (IllegalStateException e) {
                caught.add(name); // drew more uniforms than Python
            }
        }
        if (caught.isEmpty()) fail("a deliberately wrong acceptance rule replayed every sampling run of " + file + " without a difference");
        return caught;
    }
}
