package org.omnidraft.specdecode;

import java.io.File;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * A tokenizer seen as bytes (mirror of {@code runtime/tokenizer.py}): every id spells a fixed byte
 * string, so detokenizing is concatenation and byte offsets of tokens are exact.
 */
public final class TokenCodec {
    public static final String SPM_SPACE = "\u2581";
    private static final String ANCHOR = "\n";

    public final HfTokenizer tokenizer;
    public final String kind; // "byte-level" | "sentencepiece"
    private final byte[][] tokenBytes;
    private final boolean[] special;
    private final boolean[] byteFallback;
    public final boolean prependsSpace;
    public final String sha256;
    public final int[] startIds;
    public final Set<Integer> eosIds;
    private final int[] markerIds; // byte-fallback ids spelling a literal "▁" (SentencePiece with fallback)
    private final List<String> specialText; // what the special tokens look like in text ("<s>")

    private TokenCodec(HfTokenizer tok, String sha256) throws TokenizerException {
        this.tokenizer = tok;
        this.sha256 = sha256;
        Map<String, Object> spec = tok.spec();
        boolean byteLevel = hasComponent(spec.get("pre_tokenizer"), "ByteLevel") || hasComponent(spec.get("decoder"), "ByteLevel");
        kind = byteLevel ? "byte-level" : "sentencepiece";
        int size = tok.vocabSize();
        tokenBytes = new byte[size][];
        special = new boolean[size];
        byteFallback = new boolean[size];
        for (HfTokenizer.AddedToken t : tok.addedTokens()) if (t.special) special[t.id] = true;
        for (int id = 0; id < size; id++) {
            String token = tok.idToToken(id);
            if (token == null || special[id]) {
                tokenBytes[id] = new byte[0];
                continue;
            }
            if (byteLevel) {
                byte[] b = ByteLevel.toBytes(token);
                tokenBytes[id] = b != null ? b : Utf8.encode(token); // added non-special tokens are plain text
            } else if (HfTokenizer.byteToken(token) >= 0) {
                tokenBytes[id] = new byte[] {(byte) HfTokenizer.byteToken(token)};
                byteFallback[id] = true;
            } else {
                tokenBytes[id] = Utf8.encode(token.replace(SPM_SPACE, " "));
            }
        }
        int[] probe = tok.encode("x", false);
        prependsSpace = Arrays.equals(spell(probe), Utf8.encode(" x"));
        int[] withTemplate = tok.encode("x", true);
        int[] start = new int[0];
        if (withTemplate.length >= probe.length
                && Arrays.equals(Arrays.copyOfRange(withTemplate, withTemplate.length - probe.length, withTemplate.length), probe)) {
            start = Arrays.copyOf(withTemplate, withTemplate.length - probe.length);
        }
        startIds = start;
        Set<Integer> eos = new HashSet<Integer>();
        for (String name : new String[] {"</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<|eot_id|>"}) {
            Integer id = tok.tokenToId(name);
            if (id != null) eos.add(id);
        }
        eosIds = eos;
        int[] byByte = new int[256];
        Arrays.fill(byByte, -1);
        for (int id = 0; id < size; id++) if (byteFallback[id]) byByte[tokenBytes[id][0] & 0xff] = id;
        byte[] marker = Utf8.encode(SPM_SPACE);
        int[] m = new int[marker.length];
        boolean all = !byteLevel;
        for (int k = 0; k < marker.length; k++) {
            m[k] = byByte[marker[k] & 0xff];
            all &= m[k] >= 0;
        }
        markerIds = all ? m : new int[0];
        Set<String> sp = new java.util.TreeSet<String>();
        for (HfTokenizer.AddedToken t : tok.addedTokens()) if (t.special && !t.content.isEmpty()) sp.add(t.content);
        specialText = new ArrayList<String>(sp);
    }

    public static TokenCodec fromBytes(byte[] raw) throws TokenizerException {
        HfTokenizer tok = HfTokenizer.fromJson(new String(raw, Utf8.UTF8));
        return new TokenCodec(tok, Files8.sha256Hex(raw));
    }

    public static TokenCodec load(File file) throws TokenizerException {
        if (file.isDirectory()) file = new File(file, "tokenizer.json");
        if (!file.isFile()) {
            throw new TokenizerException("no tokenizer at " + file + ": push the model's tokenizer.json there");
        }
        try {
            return fromBytes(Files8.readAll(file));
        } catch (java.io.IOException e) {
            throw new TokenizerException("cannot read " + file + " (" + e.getMessage() + ")");
        }
    }

    private static boolean hasComponent(Object node, String kind) {
        if (node instanceof Map) {
            Map<?, ?> m = (Map<?, ?>) node;
            if (kind.equals(m.get("type"))) return true;
            for (Object v : m.values()) if (hasComponent(v, kind)) return true;
        } else if (node instanceof List) {
            for (Object v : (List<?>) node) if (hasComponent(v, kind)) return true;
        }
        return false;
    }

    public int vocabSize() {
        return tokenBytes.length;
    }

    public byte[] tokenBytes(int id) {
        return tokenBytes[id];
    }

    public int tokenLength(int id) {
        return id >= 0 && id < tokenBytes.length ? tokenBytes[id].length : 0;
    }

    public boolean isSpecial(int id) {
        return id >= 0 && id < special.length && special[id];
    }

    public boolean isByteFallback(int id) {
        return id >= 0 && id < byteFallback.length && byteFallback[id];
    }

    /** Tokens of {@code text} at the start of a document, without special tokens. */
    public int[] encode(String text) {
        return tokenizer.encode(text, false);
    }

    /**
     * Tokens of {@code text} as it tokenizes after a token boundary mid-document, or null when no
     * exact encoding was found (the caller widens its window).
     */
    public int[] encodeContinuation(String text) {
        if (text.isEmpty()) return new int[0];
        byte[] want = Utf8.encode(text);
        if (!prependsSpace) {
            int[] ids = encode(text);
            return Arrays.equals(spell(ids), want) ? ids : null;
        }
        if (text.charAt(0) == ' ') {
            int[] ids = encode(text.substring(1));
            if (Arrays.equals(spell(ids), want)) return ids;
        }
        int[] ids = encode(ANCHOR + text);
        int headLen = 1 + Utf8.encode(ANCHOR).length; // " " + anchor
        int spelled = 0;
        for (int i = 0; i < ids.length; i++) {
            if (spelled == headLen) {
                int[] rest = Arrays.copyOfRange(ids, i, ids.length);
                return Arrays.equals(spell(rest), want) ? rest : null;
            }
            spelled += tokenBytes[ids[i]].length;
            if (spelled > headLen) return null;
        }
        return null;
    }

    /**
     * Tokens spelling exactly the bytes of {@code text} (after a virtual leading space at the start
     * of a document), as {@link #encode} or {@link #encodeContinuation} would for most text, or null
     * (mirror of {@code TokenCodec.encode_exact}): the text is cut after the first character of each
     * special token's text, and a literal "▁" is spelled by its byte-fallback tokens, since the
     * tokenizer spells neither as it is and every byte offset after one would shift.
     */
    public int[] encodeExact(String text, boolean continuation) {
        List<String> pieces = literalPieces(text);
        if (pieces == null) return continuation ? encodeContinuation(text) : encode(text);
        IntList out = new IntList(text.length() + 4);
        for (int k = 0; k < pieces.size(); k++) {
            String piece = pieces.get(k);
            if (piece == null) {
                out.addAll(markerIds);
                continue;
            }
            int[] ids = k == 0 && !continuation ? encode(piece) : encodeContinuation(piece);
            if (ids == null) return null;
            out.addAll(ids);
        }
        return out.toArray();
    }

    /** {@code text} cut as {@link #encodeExact} encodes it (null: a literal "▁"), or null if uncut. */
    private List<String> literalPieces(String text) {
        java.util.TreeSet<Integer> hits = new java.util.TreeSet<Integer>();
        for (String sp : specialText) {
            for (int i = text.indexOf(sp); i >= 0; i = text.indexOf(sp, i + 1)) hits.add(i);
        }
        if (markerIds.length > 0) {
            for (int i = text.indexOf(SPM_SPACE); i >= 0; i = text.indexOf(SPM_SPACE, i + 1)) hits.add(i);
        }
        if (hits.isEmpty()) return null;
        List<String> pieces = new ArrayList<String>();
        int last = 0;
        for (int i : hits) {
            int next = text.offsetByCodePoints(i, 1);
            if (markerIds.length > 0 && text.startsWith(SPM_SPACE, i)) {
                addPiece(pieces, text.substring(last, i));
                pieces.add(null);
            } else {
                addPiece(pieces, text.substring(last, next));
            }
            last = next;
        }
        addPiece(pieces, text.substring(last));
        return pieces;
    }

    private static void addPiece(List<String> pieces, String piece) {
        if (!piece.isEmpty()) pieces.add(piece);
    }

    public byte[] spell(int[] ids) {
        return spell(ids, 0, ids.length);
    }

    public byte[] spell(int[] ids, int from, int to) {
        int n = 0;
        for (int k = from; k < to; k++) n += tokenBytes[ids[k]].length;
        byte[] out = new byte[n];
        int p = 0;
        for (int k = from; k < to; k++) {
            byte[] b = tokenBytes[ids[k]];
            System.arraycopy(b, 0, out, p, b.length);
            p += b.length;
        }
        return out;
    }

    public String decode(int[] ids) {
        return Utf8.decodeLossy(spell(ids));
    }

    /** The token byte table as one list, for tests that compare it with Python's. */
    List<byte[]> table() {
        return new ArrayList<byte[]>(Arrays.asList(tokenBytes));
    }
}
