package org.omnidraft.specdecode;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.PriorityQueue;

/**
 * The BPE model of HF {@code tokenizers} (models/bpe): characters of a pre-token become symbols
 * (unknown ones fall back to {@code <0xNN>} byte tokens or {@code unk}), then the lowest-ranked
 * adjacent pair is merged until none applies, with the same queue and tie-breaking as the Rust code
 * (rank first, then leftmost position).
 */
final class BpeModel {
    final Map<String, Integer> vocab;
    final String[] idToToken;
    private final LongLongMap merges; // (left id, right id) -> (rank << 32) | merged id
    private final Integer unkId;
    private final boolean fuseUnk;
    private final boolean byteFallback;
    private final boolean ignoreMerges;
    private final int[] byteTokens = new int[256]; // id of <0xNN>, or -1

    BpeModel(Map<String, Object> spec) throws TokenizerException {
        String type = String.valueOf(spec.get("type"));
        if (!"BPE".equals(type)) {
            throw new TokenizerException("unsupported tokenizer model '" + type
                    + "': this core implements BPE tokenizers (SentencePiece-BPE like Llama-2, byte-level like GPT-2)");
        }
        if (spec.get("continuing_subword_prefix") != null || spec.get("end_of_word_suffix") != null) {
            throw new TokenizerException("BPE with continuing_subword_prefix/end_of_word_suffix is not supported; "
                    + "use a SentencePiece-BPE or byte-level BPE tokenizer.json");
        }
        if (spec.get("dropout") != null) {
            throw new TokenizerException("BPE dropout makes encoding random; export the tokenizer with dropout null");
        }
        Map<String, Object> v = Json.asObject(spec.get("vocab"), "model.vocab");
        vocab = new HashMap<String, Integer>(v.size() * 2);
        int max = -1;
        for (Map.Entry<String, Object> e : v.entrySet()) {
            int id = (int) Json.asLong(e.getValue(), "model.vocab id");
            vocab.put(e.getKey(), id);
            max = Math.max(max, id);
        }
        idToToken = new String[max + 1];
        for (Map.Entry<String, Integer> e : vocab.entrySet()) idToToken[e.getValue()] = e.getKey();
        List<Object> m = Json.asArray(spec.get("merges"), "model.merges");
        merges = new LongLongMap(m.size() * 2 + 16);
        for (int rank = 0; rank < m.size(); rank++) {
            Object item = m.get(rank);
            String a, b;
            if (item instanceof String) {
                String s = (String) item;
                int sp = s.indexOf(' ');
                if (sp < 0) throw new TokenizerException("merge '" + s + "' has no space between its two parts");
                a = s.substring(0, sp);
                b = s.substring(sp + 1);
            } else {
                List<Object> pair = Json.asArray(item, "merge");
                if (pair.size() != 2) throw new TokenizerException("a merge must have two parts, got " + pair);
                a = Json.asString(pair.get(0), "merge part");
                b = Json.asString(pair.get(1), "merge part");
            }
            Integer ia = vocab.get(a), ib = vocab.get(b), ic = vocab.get(a + b);
            if (ia == null || ib == null || ic == null) {
                throw new TokenizerException("merge '" + a + " " + b + "' uses a token missing from the vocabulary; "
                        + "the tokenizer.json is damaged");
            }
            long key = ((long) ia << 32) | (ib & 0xffffffffL);
            if (!merges.containsKey(key)) merges.put(key, ((long) rank << 32) | ic);
        }
        Object unk = spec.get("unk_token");
        unkId = unk instanceof String ? vocab.get(unk) : null;
        fuseUnk = Json.asBool(spec.get("fuse_unk"), false);
        byteFallback = Json.asBool(spec.get("byte_fallback"), false);
        ignoreMerges = Json.asBool(spec.get("ignore_merges"), false);
        for (int b = 0; b < 256; b++) {
            Integer id = vocab.get(String.format("<0x%02X>", b));
            byteTokens[b] = id == null ? -1 : id;
        }
    }

    /** Appends the ids of one pre-token to {@code out}. */
    void tokenize(String piece, IntList out) {
        if (piece.isEmpty()) return;
        if (ignoreMerges) {
            Integer whole = vocab.get(piece);
            if (whole != null) {
                out.add(whole);
                return;
            }
        }
        // Symbols as a doubly linked list over arrays (Rust's Word).
        int n = piece.length();
        int[] c = new int[n + 8];
        int[] len = new int[n + 8];
        int[] prev = new int[n + 8];
        int[] next = new int[n + 8];
        int count = 0;
        int pendingUnk = -1, pendingUnkLen = 0;
        int i = 0;
        while (i < n) {
            if (count + 6 > c.length) { // a code point adds at most 4 byte tokens plus a pending unk
                int cap = c.length * 2;
                c = grow(c, cap); len = grow(len, cap); prev = grow(prev, cap); next = grow(next, cap);
            }
            int cp = piece.codePointAt(i);
            int end = i + Character.charCount(cp);
            String s = piece.substring(i, end);
            int byteLen = utf8Len(cp);
            Integer id = vocab.get(s);
            i = end;
            if (id != null) {
                if (pendingUnk >= 0) {
                    count = add(c, len, prev, next, count, pendingUnk, pendingUnkLen);
                    pendingUnk = -1;
                }
                count = add(c, len, prev, next, count, id, byteLen);
                continue;
            }
            if (byteFallback) {
                byte[] bytes = Utf8.encode(s);
                boolean all = true;
                for (byte b : bytes) if (byteTokens[b & 0xff] < 0) all = false;
                if (all) {
                    // As in Rust, a pending unk is not flushed before byte tokens.
                    for (byte b : bytes) count = add(c, len, prev, next, count, byteTokens[b & 0xff], 1);
                    continue;
                }
            }
            if (unkId != null) {
                if (pendingUnk >= 0 && fuseUnk) {
                    pendingUnkLen += byteLen;
                } else {
                    if (pendingUnk >= 0) count = add(c, len, prev, next, count, pendingUnk, pendingUnkLen);
                    pendingUnk = unkId;
                    pendingUnkLen = byteLen;
                }
            }
        }
        if (pendingUnk >= 0) {
            if (count + 1 > c.length) {
                c = grow(c, count + 1); len = grow(len, count + 1); prev = grow(prev, count + 1); next = grow(next, count + 1);
            }
            count = add(c, len, prev, next, count, pendingUnk, pendingUnkLen);
        }
        mergeAll(c, len, prev, next, count);
        for (int k = 0; k < count; k++) if (len[k] != 0) out.add(c[k]);
    }

    private static int[] grow(int[] a, int cap) {
        int[] b = new int[cap];
        System.arraycopy(a, 0, b, 0, a.length);
        return b;
    }

    private static int add(int[] c, int[] len, int[] prev, int[] next, int count, int id, int byteLen) {
        c[count] = id;
        len[count] = byteLen;
        prev[count] = count - 1;
        next[count] = -1;
        if (count > 0) next[count - 1] = count;
        return count + 1;
    }

    private static final class Merge {
        final int pos, rank, newId;

        Merge(int pos, int rank, int newId) {
            this.pos = pos;
            this.rank = rank;
            this.newId = newId;
        }
    }

    private static final java.util.Comparator<Merge> ORDER = new java.util.Comparator<Merge>() {
        @Override
        public int compare(Merge a, Merge b) {
            if (a.rank != b.rank) return a.rank < b.rank ? -1 : 1;
            return a.pos < b.pos ? -1 : (a.pos == b.pos ? 0 : 1);
        }
    };

    private void mergeAll(int[] c, int[] len, int[] prev, int[] next, int count) {
        if (count < 2) return;
        PriorityQueue<Merge> queue = new PriorityQueue<Merge>(count, ORDER);
        for (int k = 0; k + 1 < count; k++) {
            long m = merges.get(key(c[k], c[k + 1]));
            if (m >= 0) queue.add(new Merge(k, (int) (m >>> 32), (int) m));
        }
        while (!queue.isEmpty()) {
            Merge top = queue.poll();
            if (len[top.pos] == 0) continue;
            if (next[top.pos] == -1) continue;
            int nextPos = next[top.pos];
            long cur = merges.get(key(c[top.pos], c[nextPos]));
            if (cur < 0 || (int) cur != top.newId) continue; // expired entry
            c[top.pos] = top.newId;
            len[top.pos] += len[nextPos];
            next[top.pos] = next[nextPos];
            len[nextPos] = 0;
            int rightNext = next[nextPos];
            if (rightNext > -1 && rightNext < count) prev[rightNext] = top.pos;
            if (prev[top.pos] >= 0) {
                int p = prev[top.pos];
                long m = merges.get(key(c[p], c[top.pos]));
                if (m >= 0) queue.add(new Merge(p, (int) (m >>> 32), (int) m));
            }
            int nx = next[top.pos];
            if (nx >= 0 && nx < count) {
                long m = merges.get(key(c[top.pos], c[nx]));
                if (m >= 0) queue.add(new Merge(top.pos, (int) (m >>> 32), (int) m));
            }
        }
    }

    private static long key(int a, int b) {
        return ((long) a << 32) | (b & 0xffffffffL);
    }

    private static int utf8Len(int cp) {
        if (cp < 0x80) return 1;
        if (cp < 0x800) return 2;
        if (cp < 0x10000) return 3;
        return 4;
    }

    /** Open-addressing long -> long map (values >= 0; -1 means absent), to avoid boxing 60k merges. */
    static final class LongLongMap {
        private long[] keys;
        private long[] vals;
        private boolean[] used;
        private int size;

        LongLongMap(int capacity) {
            int cap = 16;
            while (cap < capacity * 2) cap <<= 1;
            keys = new long[cap];
            vals = new long[cap];
            used = new boolean[cap];
        }

        private int slot(long k) {
            long h = k * 0x9E3779B97F4A7C15L;
            int mask = keys.length - 1;
            int s = (int) (h >>> 33) & mask;
            while (used[s] && keys[s] != k) s = (s + 1) & mask;
            return s;
        }

        boolean containsKey(long k) {
            return used[slot(k)];
        }

        long get(long k) {
            int s = slot(k);
            return used[s] ? vals[s] : -1;
        }

        void put(long k, long v) {
            if ((size + 1) * 2 > keys.length) rehash();
            int s = slot(k);
            if (!used[s]) size++;
            used[s] = true;
            keys[s] = k;
            vals[s] = v;
        }

        private void rehash() {
            long[] ok = keys, ov = vals;
            boolean[] ou = used;
            keys = new long[ok.length * 2];
            vals = new long[ok.length * 2];
            used = new boolean[ok.length * 2];
            size = 0;
            for (int k = 0; k < ok.length; k++) if (ou[k]) put(ok[k], ov[k]);
        }
    }
}
