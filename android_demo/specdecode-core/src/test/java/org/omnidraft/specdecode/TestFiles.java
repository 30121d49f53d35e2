package org.omnidraft.specdecode;

import static org.junit.Assert.fail;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.util.HashMap;
import java.util.Map;

/** Where the tests find their inputs: committed vectors on the classpath, tokenizers on disk. */
final class TestFiles {
    private static final Map<String, TokenCodec> CODECS = new HashMap<String, TokenCodec>();
    private static final Map<String, Object> VECTORS = new HashMap<String, Object>();

    private TestFiles() {}

    /** A vector file under src/test/resources/vectors, parsed (cached per run). */
    static synchronized Object vectors(String name) {
        Object v = VECTORS.get(name);
        if (v != null) return v;
        InputStream in = TestFiles.class.getResourceAsStream("/vectors/" + name);
        if (in == null) {
            fail("vector file vectors/" + name + " is not on the test classpath; regenerate with `omnidraft android-vectors`");
        }
        try {
            v = Json.parse(new String(Files8.readAll(in), Utf8.UTF8));
            in.close();
        } catch (IOException e) {
            throw new AssertionError("cannot read vectors/" + name + ": " + e);
        }
        VECTORS.put(name, v);
        return v;
    }

    /**
     * tokenizer.json of a shipped family. The path comes from the system property
     * {@code omnidraft.tokenizer.<name>} (test_core.sh and Gradle set it), else the converter's cache
     * {@code $OMNIDRAFT_CACHE/tokenizers/<name>} or {@code ~/.cache/omnidraft/tokenizers/<name>}.
     */
    static File tokenizerFile(String name) {
        String prop = System.getProperty("omnidraft.tokenizer." + name);
        if (prop != null && !prop.isEmpty()) return new File(prop);
        String cache = System.getenv("OMNIDRAFT_CACHE");
        File root = cache != null && !cache.isEmpty() ? new File(cache)
                : new File(System.getProperty("user.home"), ".cache/omnidraft");
        return new File(new File(new File(root, "tokenizers"), name), "tokenizer.json");
    }

    static synchronized TokenCodec codec(String name) {
        TokenCodec c = CODECS.get(name);
        if (c != null) return c;
        File f = tokenizerFile(name);
        if (!f.isFile()) {
            fail("tokenizer " + name + " not found at " + f + ": run `python -m omnidraft.models.gguf_tokenizers "
                    + name + "` (or pass -Domnidraft.tokenizer." + name + "=PATH)");
        }
        try {
            c = TokenCodec.load(f);
        } catch (TokenizerException e) {
            throw new AssertionError("loading " + f + ": " + e.getMessage());
        }
        CODECS.put(name, c);
        return c;
    }

    static int[] ints(Object list) {
        java.util.List<Object> l = Json.asArray(list, "int list");
        int[] out = new int[l.size()];
        for (int i = 0; i < out.length; i++) out[i] = (int) Json.asLong(l.get(i), "int");
        return out;
    }

    static String hex(byte[] b) {
        StringBuilder s = new StringBuilder(b.length * 2);
        for (byte x : b) s.append(String.format("%02x", x & 0xff));
        return s.toString();
    }
}
