package org.omnidraft.specdecode;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.io.File;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.junit.Test;

/** Small pieces and bad input: JSON, UTF-8, sampling arithmetic, the cache file, refused files. */
public class CoreUnitTest {
    private static File temp(String content) throws Exception {
        File f = File.createTempFile("specdecode", ".json");
        f.deleteOnExit();
        Files8.writeAtomic(f, content.getBytes(Utf8.UTF8));
        return f;
    }

    @Test
    public void jsonWritesWhatPythonCompactDumpsWrites() {
        Object v = Json.parse("{\"a\": [1, -2, 3.5, true, null, \"\\u00e9\\n\\\"x\\\"\"], \"b\": {}}");
        // json.dumps(v, separators=(",", ":")) in Python gives exactly this (ASCII, lower-case escapes).
        assertEquals("{\"a\":[1,-2,3.5,true,null,\"\\u00e9\\n\\\"x\\\"\"],\"b\":{}}", Json.write(v));
        assertEquals("\"\\ud83d\\ude00\"", Json.write("\uD83D\uDE00"));
    }

    @Test
    public void jsonRefusesMalformedInput() {
        for (String bad : new String[] {"", "{", "[1,]", "{\"a\" 1}", "nul", "\"abc", "[1] x", "01x", "{\"a\":\"\\q\"}"}) {
            try {
                Json.parse(bad);
                fail("accepted " + bad);
            } catch (IllegalArgumentException expected) {
                assertTrue(expected.getMessage().contains("invalid JSON"));
            }
        }
    }

    @Test
    public void utf8ReplacementFollowsMaximalSubparts() {
        // Python: bytes.decode("utf-8", "replace") of each input.
        assertEquals("\uFFFD", Utf8.decodeLossy(new byte[] {(byte) 0xe2, (byte) 0x82}));
        assertEquals("\uFFFD\uFFFD", Utf8.decodeLossy(new byte[] {(byte) 0xff, (byte) 0xfe}));
        assertEquals("\uFFFD\uFFFD\uFFFD", Utf8.decodeLossy(new byte[] {(byte) 0xed, (byte) 0xa0, (byte) 0x80}));
        assertEquals("a\uFFFDb", Utf8.decodeLossy(new byte[] {'a', (byte) 0xf0, (byte) 0x9f, (byte) 0x98, 'b'}));
        assertEquals("\uD83D\uDE00", Utf8.decodeLossy(new byte[] {(byte) 0xf0, (byte) 0x9f, (byte) 0x98, (byte) 0x80}));
        assertFalse(Utf8.isValid(new byte[] {(byte) 0xc3}, 0, 1));
        assertTrue(Utf8.isValid(Utf8.encode("\uFFFD"), 0, 3));
    }

    @Test
    public void drawAndResidualFollowNumpySemantics() {
        double[] p = {0.0, 0.25, 0.0, 0.75};
        assertEquals(1, Sampling.draw(p, 0.0)); // searchsorted(side="right") skips leading zeros
        assertEquals(1, Sampling.draw(p, 0.2499));
        assertEquals(3, Sampling.draw(p, 0.25));
        assertEquals(3, Sampling.draw(p, 0.999999));
        double[] r = Sampling.residual(new double[] {0.5, 0.5}, new double[] {0.75, 0.25});
        assertArrayEquals(new double[] {0.0, 1.0}, r, 0.0);
        double[] same = {0.5, 0.5};
        assertTrue("q' covering p falls back to p", Sampling.residual(same, same) == same);
        double[] q = Sampling.softmax(new float[] {1f, 2f, 3f}, 1.0, new boolean[] {true, false, true});
        assertEquals(0.0, q[1], 0.0);
        assertEquals(1.0, q[0] + q[2], 1e-15);
        assertEquals(2, Sampling.maskedArgmax(new float[] {5f, 9f, 1f}, new boolean[] {false, false, true}));
    }

    @Test
    public void pairwiseSumMatchesNumpyBlocking() {
        double[] a = new double[1000];
        for (int i = 0; i < a.length; i++) a[i] = 1.0 / (i + 1);
        double seq = 0;
        for (double x : a) seq += x;
        assertEquals(seq, Sampling.pairwiseSum(a, 0, a.length), 1e-12);
        // np.add.reduce(1/np.arange(1, 1001)) == 7.485470860550345 (pairwise; sequential differs in the last digits)
        assertEquals(7.485470860550345, Sampling.pairwiseSum(a, 0, a.length), 0.0);
    }

    @Test
    public void cacheRoundTripsThroughItsFile() throws Exception {
        NgramCache c = new NgramCache("d".replace("d", "aa"), "bb", 100, null, "lfu");
        c.observe(new NgramCache.Key(new int[] {1, 2}), 7);
        c.observe(new NgramCache.Key(new int[] {3}), 8);
        c.observe(new NgramCache.Key(new int[] {1, 2}), 7);
        c.recordHit(new NgramCache.Key(new int[] {3}));
        File f = temp("");
        c.save(f);
        NgramCache back = NgramCache.load(f, "aa", "bb", 100, 50, null, null);
        assertEquals(2, back.size());
        assertEquals(7, back.get(new NgramCache.Key(new int[] {1, 2})));
        assertEquals(c.clock(), back.clock());
        assertTrue(back.usesDrafterToken(2));
        assertFalse(back.usesDrafterToken(4));
        Map<String, Object> doc = Json.asObject(Json.parse(new String(Files8.readAll(f), Utf8.UTF8)), "doc");
        assertEquals("omnidraft.ngram-cache", doc.get("format"));
        List<Object> entries = Json.asArray(doc.get("entries"), "entries");
        assertEquals("[[[1,2],7,2,0,3],[[3],8,1,1,4]]", Json.write(entries));
    }

    @Test
    public void lfuEvictsTheLeastUsedAndLruTheOldest() {
        NgramCache lfu = new NgramCache("a", "b", 10, 2, "lfu");
        NgramCache.Key k1 = new NgramCache.Key(new int[] {1}), k2 = new NgramCache.Key(new int[] {2}), k3 = new NgramCache.Key(new int[] {3});
        lfu.observe(k1, 1);
        lfu.observe(k1, 1);
        lfu.observe(k2, 2);
        lfu.observe(k3, 3); // k2 has the lowest count
        assertTrue(lfu.contains(k1) && lfu.contains(k3) && !lfu.contains(k2));
        NgramCache lru = new NgramCache("a", "b", 10, 2, "lru");
        lru.observe(k1, 1);
        lru.observe(k1, 1);
        lru.observe(k2, 2);
        lru.observe(k3, 3); // k1 was used least recently
        assertTrue(!lru.contains(k1) && lru.contains(k2) && lru.contains(k3));
    }

    private static void assertCacheRefused(String content, String expect) throws Exception {
        try {
            NgramCache.load(temp(content), "aa", "bb", 100, 50, null, null);
            fail("accepted cache file " + content);
        } catch (CacheFileException e) {
            assertTrue(e.getMessage(), e.getMessage().contains(expect));
            assertTrue("the message says how to fix it", e.getMessage().contains("delete it"));
        }
    }

    @Test
    public void cacheFileOfTheWrongFormatIsRefused() throws Exception {
        NgramCache c = new NgramCache("aa", "bb", 100, null, "lfu");
        c.observe(new NgramCache.Key(new int[] {5, 6}), 9);
        String good = new String(c.serialise(), Utf8.UTF8);
        assertCacheRefused("not json", "not JSON");
        assertCacheRefused("[1, 2]", "not an omnidraft n-gram cache");
        assertCacheRefused(good.replace("omnidraft.ngram-cache", "something-else"), "not an omnidraft n-gram cache");
        assertCacheRefused(good.replace("\"version\":1", "\"version\":2"), "not an omnidraft n-gram cache");
        assertCacheRefused(good.replace("\"aa\"", "\"cc\""), "another drafter/target tokenizer pair");
        assertCacheRefused(good.replace("[[[5,6],9", "[[[5,7],9"), "checksum mismatch");
        NgramCache wide = new NgramCache("aa", "bb", 1000, null, "lfu");
        wide.observe(new NgramCache.Key(new int[] {500}), 9); // valid checksum, id beyond this drafter's width
        assertCacheRefused(new String(wide.serialise(), Utf8.UTF8), "malformed entry");
    }

    private static void assertTokenizerRefused(String content, String expect) {
        try {
            TokenCodec.fromBytes(content.getBytes(Utf8.UTF8));
            fail("accepted tokenizer " + content);
        } catch (TokenizerException e) {
            assertTrue(e.getMessage(), e.getMessage().contains(expect));
        }
    }

    @Test
    public void tokenizerFileOfTheWrongFormatIsRefused() {
        String model = "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}";
        assertTokenizerRefused("<html>", "not a tokenizer.json");
        assertTokenizerRefused("{\"version\":\"1.0\"}", "no \"model\"");
        assertTokenizerRefused("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", "unsupported tokenizer model 'WordPiece'");
        assertTokenizerRefused("{" + model + ",\"pre_tokenizer\":{\"type\":\"Metaspace\"}}", "unsupported pre_tokenizer 'Metaspace'");
        assertTokenizerRefused("{" + model + ",\"normalizer\":{\"type\":\"BertNormalizer\"}}", "unsupported normalizer");
        assertTokenizerRefused("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", "missing from the vocabulary");
    }

    @Test
    public void minimalBpeTokenizerEncodesAndDecodes() throws Exception {
        String json = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"abb\":3},\"merges\":[\"a b\",\"ab b\"]},"
                + "\"decoder\":{\"type\":\"Fuse\"}}";
        TokenCodec c = TokenCodec.fromBytes(json.getBytes(Utf8.UTF8));
        assertArrayEquals(new int[] {3, 2, 0}, c.encode("abbaba"));
        assertEquals("abbaba", c.tokenizer.decode(new int[] {3, 2, 0, 0}, false).substring(0, 6));
        assertEquals("sentencepiece", c.kind);
    }

    @Test
    public void drafterContextFollowsRetokenization() {
        TokenCodec c = TestFiles.codec("llama-spm");
        DrafterContext ctx = new DrafterContext(c, "Hello", 8);
        ctx.append(Utf8.encode(" world, this is"));
        ctx.append(Utf8.encode(" a test of 日本"));
        byte[] emoji = Utf8.encode("語 👍");
        ctx.append(Arrays.copyOf(emoji, emoji.length - 2)); // a split character waits
        ctx.append(Arrays.copyOfRange(emoji, emoji.length - 2, emoji.length));
        int[] ids = ctx.ids();
        int[] want = c.encode("Hello world, this is a test of 日本語 👍");
        assertEquals("<s> prefix", 1, ids[0]);
        assertArrayEquals(want, Arrays.copyOfRange(ids, 1, ids.length));
    }

    @Test
    public void drafterContextSpellsLiteralMarkersAndSpecialTokenText() {
        // The tokenizer spells a literal "\u2581" as a space and "<s>" as nothing; the context must
        // spell both as they are, or every byte offset after them shifts.
        TokenCodec c = TestFiles.codec("llama-spm");
        String prompt = "x\u2581y <s>";
        DrafterContext ctx = new DrafterContext(c, prompt, 4);
        String[] pieces = {" a\u2581", "\u2581b</s", "> c <s", ">\n\u2581 d"};
        StringBuilder all = new StringBuilder(prompt);
        for (String p : pieces) {
            List<int[]> window = ctx.append(Utf8.encode(p));
            all.append(p);
            for (int[] t : window) assertTrue("token spans a position", t[2] >= t[1]);
        }
        int[] ids = ctx.ids();
        byte[] spelled = c.spell(Arrays.copyOfRange(ids, 1, ids.length));
        assertArrayEquals(Utf8.encode(" " + all), spelled); // the prepended "\u2581" spells a space
    }

    @Test
    public void autoDraftLengthGrowsAndShrinks() {
        AutoDraftLength a = new AutoDraftLength(4, 1, 8);
        a.update(4, 4);
        assertEquals(5, a.current());
        a.update(5, 0);
        a.update(4, 0);
        assertEquals(3, a.current());
        for (int i = 0; i < 10; i++) a.update(3, 0);
        assertEquals(1, a.current());
    }

    @Test
    public void configAndPromptErrorsAreReported() throws Exception {
        DecodeConfig cfg = new DecodeConfig();
        cfg.temperature = -1;
        try {
            cfg.validate();
            fail("negative temperature accepted");
        } catch (InvalidArgumentException e) {
            assertTrue(e.getMessage().contains("temperature"));
        }
        cfg = new DecodeConfig();
        cfg.mode = "fast";
        try {
            cfg.validate();
            fail("unknown mode accepted");
        } catch (InvalidArgumentException e) {
            assertTrue(e.getMessage().contains("ngram, dm, target-only"));
        }
    }
}
