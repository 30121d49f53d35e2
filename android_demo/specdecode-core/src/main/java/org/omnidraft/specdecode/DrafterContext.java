package org.omnidraft.specdecode;

import java.util.ArrayList;
import java.util.List;

/**
 * The drafter's token context, kept equal to a re-tokenization of the target's accepted text
 * (mirror of {@code DrafterContext} in {@code runtime/translate.py}). Only a short look-behind
 * window is re-tokenized after each round, never the whole context.
 */
public final class DrafterContext {
    private final TokenCodec codec;
    private final int lookbehind;
    private final int[] prefix;
    private byte[] text;
    private int textLen;
    private int validEnd; // bytes that form complete UTF-8 characters
    private IntList tokens;
    private IntList starts;

    public DrafterContext(TokenCodec codec, String text, int lookbehind) {
        this.codec = codec;
        this.lookbehind = lookbehind;
        this.prefix = codec.startIds.clone();
        byte[] b = Utf8.encode(text);
        this.text = b;
        this.textLen = b.length;
        this.validEnd = textLen;
        IntList[] enc = encodeFromStart(text);
        tokens = enc[0];
        starts = enc[1];
    }

    /** prefix (start ids) + tokens. */
    public int[] ids() {
        int[] out = new int[prefix.length + tokens.size()];
        System.arraycopy(prefix, 0, out, 0, prefix.length);
        for (int i = 0; i < tokens.size(); i++) out[prefix.length + i] = tokens.get(i);
        return out;
    }

    public int size() {
        return prefix.length + tokens.size();
    }

    /** Bytes of accepted text (prompt included). */
    public int textLength() {
        return textLen;
    }

    private IntList startsOf(int[] ids, int at, int virtual) {
        IntList out = new IntList(ids.length + 4);
        int pos = at - virtual;
        for (int id : ids) {
            out.add(Math.max(pos, at));
            pos += codec.tokenLength(id);
        }
        return out;
    }

    private IntList[] encodeFromStart(String piece) {
        int[] ids = codec.encodeExact(piece, false);
        if (ids == null) ids = codec.encode(piece); // a piece beside a literal found no exact encoding
        byte[] spelled = codec.spell(ids), want = Utf8.encode(piece);
        int virtual = 0; // SentencePiece's prepended "▁"
        if (!java.util.Arrays.equals(spelled, want) && spelled.length == want.length + 1 && spelled[0] == ' ') {
            boolean same = true;
            for (int k = 0; k < want.length && same; k++) same = spelled[k + 1] == want[k];
            if (same) virtual = 1;
        }
        return new IntList[] {IntList.of(ids), startsOf(ids, 0, virtual)};
    }

    private boolean atCharStart(int n) {
        if (n >= starts.size()) return true;
        int s = starts.get(n);
        if (s >= textLen) return true;
        int b = text[s] & 0xff;
        return !(b >= 0x80 && b < 0xc0);
    }

    private int charBoundary(int n) {
        while (n > 0 && !atCharStart(n)) n--;
        return n;
    }

    private boolean validUtf8(int from, int to) {
        return Utf8.isValid(text, from, to);
    }

    /**
     * Adds accepted target bytes and re-tokenizes the tail. Returns the drafter (id, start, end) of
     * every token in the re-tokenized window.
     */
    public List<int[]> append(byte[] newBytes) {
        if (textLen + newBytes.length > text.length) {
            text = java.util.Arrays.copyOf(text, Math.max(text.length * 2, textLen + newBytes.length + 64));
        }
        System.arraycopy(newBytes, 0, text, textLen, newBytes.length);
        textLen += newBytes.length;
        int end = textLen;
        while (end > validEnd) {
            if (validUtf8(validEnd, end)) break;
            end--; // an unfinished multi-byte character waits for the next tokens
        }
        List<int[]> out = new ArrayList<int[]>();
        if (end <= validEnd) return out;
        int w = charBoundary(Math.max(0, tokens.size() - lookbehind));
        // Prefer a window starting at a word or line boundary: re-tokenization is stable there.
        for (int cand = w; cand > Math.max(-1, w - 3 * lookbehind); cand--) {
            if (cand == 0 || (atCharStart(cand) && (startsWithSpaceOrNewline(tokens.get(cand))
                    || endsWithNewline(tokens.get(cand - 1))))) {
                w = cand;
                break;
            }
        }
        int[] ids;
        IntList newStarts;
        while (true) {
            int start = w < starts.size() ? starts.get(w) : validEnd;
            String piece = Utf8.decodeLossy(text, start, end);
            if (w == 0) {
                IntList[] enc = encodeFromStart(piece);
                ids = enc[0].toArray();
                newStarts = enc[1];
                break;
            }
            ids = codec.encodeExact(piece, true);
            if (ids != null) {
                newStarts = startsOf(ids, start, 0);
                break;
            }
            w = charBoundary(Math.max(0, w - lookbehind));
        }
        tokens.truncate(w);
        tokens.addAll(ids);
        starts.truncate(w);
        starts.addAll(newStarts);
        validEnd = end;
        for (int i = w; i < tokens.size(); i++) {
            int e = i + 1 < starts.size() ? starts.get(i + 1) : end;
            out.add(new int[] {tokens.get(i), starts.get(i), e});
        }
        return out;
    }

    private boolean startsWithSpaceOrNewline(int id) {
        byte[] b = codec.tokenBytes(id);
        return b.length > 0 && (b[0] == ' ' || b[0] == '\n');
    }

    private boolean endsWithNewline(int id) {
        byte[] b = codec.tokenBytes(id);
        return b.length > 0 && b[b.length - 1] == '\n';
    }
}
