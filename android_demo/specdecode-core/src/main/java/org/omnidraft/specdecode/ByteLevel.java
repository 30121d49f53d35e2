package org.omnidraft.specdecode;

/** GPT-2's bytes_to_unicode table: every byte has a printable stand-in character. */
final class ByteLevel {
    private static final char[] BYTE_TO_CHAR = new char[256];
    private static final int[] CHAR_TO_BYTE = new int[512];

    static {
        java.util.Arrays.fill(CHAR_TO_BYTE, -1);
        boolean[] direct = new boolean[256];
        for (int b = '!'; b <= '~'; b++) direct[b] = true;
        for (int b = 0xA1; b <= 0xAC; b++) direct[b] = true;
        for (int b = 0xAE; b <= 0xFF; b++) direct[b] = true;
        int n = 0;
        for (int b = 0; b < 256; b++) {
            char c = direct[b] ? (char) b : (char) (256 + n++);
            BYTE_TO_CHAR[b] = c;
            CHAR_TO_BYTE[c] = b;
        }
    }

    private ByteLevel() {}

    static String toUnicode(byte[] bytes) {
        char[] out = new char[bytes.length];
        for (int k = 0; k < bytes.length; k++) out[k] = BYTE_TO_CHAR[bytes[k] & 0xff];
        return new String(out);
    }

    /** Bytes spelled by a byte-level token string, or null when a character is not in the table. */
    static byte[] toBytes(String token) {
        byte[] out = new byte[token.length()];
        for (int k = 0; k < token.length(); k++) {
            char c = token.charAt(k);
            if (c >= CHAR_TO_BYTE.length || CHAR_TO_BYTE[c] < 0) return null;
            out[k] = (byte) CHAR_TO_BYTE[c];
        }
        return out;
    }
}
