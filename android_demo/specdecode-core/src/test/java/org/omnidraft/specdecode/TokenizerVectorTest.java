package org.omnidraft.specdecode;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import org.junit.Test;

/** Java tokenizers against Python {@code tokenizers} + TokenCodec on every vector string, both directions. */
public class TokenizerVectorTest {
    private static Map<String, Object> vectors(String name) {
        Map<String, Object> v = Json.asObject(TestFiles.vectors("tokenizer-" + name + ".json"), "vectors");
        TokenCodec codec = TestFiles.codec(name);
        if (!codec.sha256.equals(v.get("sha256"))) {
            fail("tokenizer " + TestFiles.tokenizerFile(name) + " (sha256 " + codec.sha256 + ") is not the one the vectors were "
                    + "made with (" + v.get("sha256") + "); re-run `omnidraft android-vectors` after converting tokenizers");
        }
        return v;
    }

    private static List<Map<String, Object>> cases(Map<String, Object> v, String key) {
        List<Map<String, Object>> out = new ArrayList<Map<String, Object>>();
        for (Object o : Json.asArray(v.get(key), key)) out.add(Json.asObject(o, "case"));
        return out;
    }

    private static void report(List<String> bad, int total, String what) {
        if (!bad.isEmpty()) {
            fail(bad.size() + " of " + total + " " + what + " differ from Python; first: " + bad.subList(0, Math.min(5, bad.size())));
        }
    }

    private static void checkEncode(String name) {
        Map<String, Object> v = vectors(name);
        HfTokenizer tok = TestFiles.codec(name).tokenizer;
        List<String> bad = new ArrayList<String>();
        List<Map<String, Object>> cs = cases(v, "cases");
        for (Map<String, Object> c : cs) {
            String text = (String) c.get("text");
            int[] want = TestFiles.ints(c.get("ids"));
            int[] got = tok.encode(text, false);
            if (!Arrays.equals(want, got)) bad.add(Json.write(text) + " want " + Arrays.toString(want) + " got " + Arrays.toString(got));
            int[] wantS = TestFiles.ints(c.get("ids_special"));
            int[] gotS = tok.encode(text, true);
            if (!Arrays.equals(wantS, gotS)) bad.add("(special) " + Json.write(text) + " want " + Arrays.toString(wantS) + " got " + Arrays.toString(gotS));
        }
        report(bad, cs.size() * 2, "encodings");
        assertTrue("too few vector strings", cs.size() >= 300);
    }

    private static void checkDecode(String name) {
        Map<String, Object> v = vectors(name);
        TokenCodec codec = TestFiles.codec(name);
        List<String> bad = new ArrayList<String>();
        int total = 0;
        for (Map<String, Object> c : cases(v, "cases")) {
            int[] ids = TestFiles.ints(c.get("ids"));
            total += 3;
            if (!c.get("decode").equals(codec.tokenizer.decode(ids, false))) bad.add("decode " + Arrays.toString(ids) + " want " + Json.write(c.get("decode")) + " got " + Json.write(codec.tokenizer.decode(ids, false)));
            if (!c.get("decode_skip").equals(codec.tokenizer.decode(ids, true))) bad.add("decode_skip " + Arrays.toString(ids));
            if (!c.get("spell_hex").equals(TestFiles.hex(codec.spell(ids)))) bad.add("spell " + Arrays.toString(ids));
        }
        for (Map<String, Object> c : cases(v, "decode_cases")) {
            int[] ids = TestFiles.ints(c.get("ids"));
            total += 3;
            String d = codec.tokenizer.decode(ids, false);
            if (!c.get("decode").equals(d)) bad.add("decode " + Arrays.toString(ids) + " want " + Json.write(c.get("decode")) + " got " + Json.write(d));
            if (!c.get("decode_skip").equals(codec.tokenizer.decode(ids, true))) bad.add("decode_skip " + Arrays.toString(ids));
            if (!c.get("codec_decode").equals(codec.decode(ids))) bad.add("codec_decode " + Arrays.toString(ids) + " want " + Json.write(c.get("codec_decode")) + " got " + Json.write(codec.decode(ids)));
        }
        report(bad, total, "decodings");
    }

    private static void checkCodec(String name) throws Exception {
        Map<String, Object> v = vectors(name);
        TokenCodec codec = TestFiles.codec(name);
        assertEquals(v.get("kind"), codec.kind);
        assertEquals(((Long) v.get("vocab_size")).intValue(), codec.vocabSize());
        assertEquals(v.get("prepends_space"), codec.prependsSpace);
        assertArrayEquals(TestFiles.ints(v.get("start_ids")), codec.startIds);
        assertEquals(Arrays.toString(TestFiles.ints(v.get("eos_ids"))), new TreeSet<Integer>(codec.eosIds).toString().replace(" ", "").replace(",", ", "));
        List<Integer> special = new ArrayList<Integer>();
        int fallback = 0;
        for (int id = 0; id < codec.vocabSize(); id++) {
            if (codec.isSpecial(id)) special.add(id);
            if (codec.isByteFallback(id)) fallback++;
        }
        assertEquals(Arrays.toString(TestFiles.ints(v.get("special"))), special.toString());
        assertEquals(((Long) v.get("byte_fallback_count")).intValue(), fallback);
        MessageDigest h = MessageDigest.getInstance("SHA-256");
        for (int id = 0; id < codec.vocabSize(); id++) {
            byte[] b = codec.tokenBytes(id);
            h.update(new byte[] {(byte) b.length, (byte) (b.length >> 8), (byte) (b.length >> 16), (byte) (b.length >> 24)});
            h.update(b);
        }
        assertEquals("token byte table", v.get("token_bytes_sha256"), TestFiles.hex(h.digest()));
    }

    private interface Encoder {
        int[] encode(TokenCodec codec, String text);
    }

    /** One encoding of every case against the vectors' {@code field}; null means "no exact encoding". */
    private static void checkEncodings(String name, String field, Encoder enc) {
        Map<String, Object> v = vectors(name);
        TokenCodec codec = TestFiles.codec(name);
        List<String> bad = new ArrayList<String>();
        List<Map<String, Object>> cs = cases(v, "cases");
        for (Map<String, Object> c : cs) {
            String text = (String) c.get("text");
            int[] got = enc.encode(codec, text);
            Object want = c.get(field);
            if (want == null ? got != null : got == null || !Arrays.equals(TestFiles.ints(want), got)) {
                bad.add(Json.write(text) + " want " + want + " got " + (got == null ? null : Arrays.toString(got)));
            }
        }
        report(bad, cs.size(), field + " encodings");
    }

    private static void checkContinuation(String name) {
        checkEncodings(name, "continuation", (codec, text) -> codec.encodeContinuation(text));
    }

    private static void checkExact(String name) {
        checkEncodings(name, "exact", (codec, text) -> codec.encodeExact(text, false));
        checkEncodings(name, "exact_continuation", (codec, text) -> codec.encodeExact(text, true));
    }

    @Test public void llamaSpmEncodeMatchesPython() { checkEncode("llama-spm"); }
    @Test public void llamaSpmExactMatchesPython() { checkExact("llama-spm"); }
    @Test public void llamaSpmDecodeMatchesPython() { checkDecode("llama-spm"); }
    @Test public void llamaSpmCodecTableMatchesPython() throws Exception { checkCodec("llama-spm"); }
    @Test public void llamaSpmContinuationMatchesPython() { checkContinuation("llama-spm"); }
    @Test public void gpt2EncodeMatchesPython() { checkEncode("gpt-2"); }
    @Test public void gpt2DecodeMatchesPython() { checkDecode("gpt-2"); }
    @Test public void gpt2CodecTableMatchesPython() throws Exception { checkCodec("gpt-2"); }
    @Test public void gpt2ContinuationMatchesPython() { checkContinuation("gpt-2"); }
    @Test public void gpt2ExactMatchesPython() { checkExact("gpt-2"); }
}
