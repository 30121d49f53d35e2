package org.omnidraft.specdecode;

import java.nio.charset.Charset;

/** UTF-8 with the replacement policy of Python's {@code errors="replace"} and Rust's from_utf8_lossy. */
public final class Utf8 {
    public static final Charset UTF8 = Charset.forName("UTF-8");

    private Utf8() {}

    public static byte[] encode(String s) {
        return s.getBytes(UTF8);
    }

    /**
     * Decodes, replacing each maximal ill-formed subpart with one U+FFFD (Unicode 15, §3.9 "best
     * practice"), which is what both references do; Java's own decoder is not relied on.
     */
    public static String decodeLossy(byte[] b, int from, int to) {
        StringBuilder out = new StringBuilder(to - from);
        int i = from;
        while (i < to) {
            int c = b[i] & 0xff;
            if (c < 0x80) {
                out.append((char) c);
                i++;
                continue;
            }
            int need;
            int lo = 0x80, hi = 0xbf; // allowed range of the first continuation byte
            int cp;
            if (c >= 0xc2 && c <= 0xdf) { need = 1; cp = c & 0x1f; }
            else if (c == 0xe0) { need = 2; lo = 0xa0; cp = c & 0x0f; }
            else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) { need = 2; cp = c & 0x0f; }
            else if (c == 0xed) { need = 2; hi = 0x9f; cp = c & 0x0f; }
            else if (c == 0xf0) { need = 3; lo = 0x90; cp = c & 0x07; }
            else if (c >= 0xf1 && c <= 0xf3) { need = 3; cp = c & 0x07; }
            else if (c == 0xf4) { need = 3; hi = 0x8f; cp = c & 0x07; }
            else { out.append('\uFFFD'); i++; continue; }
            int j = i + 1;
            boolean ok = true;
            for (int k = 0; k < need; k++, j++) {
                if (j >= to) { ok = false; break; }
                int d = b[j] & 0xff;
                int l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xbf;
                if (d < l || d > h) { ok = false; break; }
                cp = (cp << 6) | (d & 0x3f);
            }
            if (ok) {
                out.appendCodePoint(cp);
                i = j;
            } else {
                out.append('\uFFFD');
                i = j; // resume at the byte that broke the sequence (or the end)
            }
        }
        return out.toString();
    }

    public static String decodeLossy(byte[] b) {
        return decodeLossy(b, 0, b.length);
    }

    /** True when {@code b[from, to)} is well-formed UTF-8. */
    public static boolean isValid(byte[] b, int from, int to) {
        String s = decodeLossy(b, from, to);
        if (s.indexOf('\uFFFD') < 0) return true;
        // A real U+FFFD in the input is valid; compare by re-encoding.
        byte[] back = encode(s);
        if (back.length != to - from) return false;
        for (int k = 0; k < back.length; k++) if (back[k] != b[from + k]) return false;
        return true;
    }
}
