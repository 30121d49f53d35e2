package org.omnidraft.specdecode;

/**
 * Rewrites a pre-tokenizer regex written for Oniguruma (what HF tokenizers uses) into an
 * equivalent java.util.regex pattern. Oniguruma's {@code \s} is Unicode White_Space while Java's
 * (and Android's ICU-backed) {@code \s} differ by platform and flags, so it is spelled out; a
 * case-insensitive group folds Unicode case as Oniguruma does.
 */
final class OnigRegex {
    static final String WS = "\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000";

    private OnigRegex() {}

    static String toJava(String re) {
        StringBuilder out = new StringBuilder(re.length() + 64);
        boolean inClass = false;
        for (int i = 0; i < re.length(); i++) {
            char c = re.charAt(i);
            if (c == '\\' && i + 1 < re.length()) {
                char e = re.charAt(i + 1);
                if (e == 's') out.append(inClass ? WS : "[" + WS + "]");
                else if (e == 'S') {
                    if (inClass) throw new IllegalArgumentException("\\S inside a character class is not supported: " + re);
                    out.append("[^" + WS + "]");
                } else out.append(c).append(e);
                i++;
                continue;
            }
            if (c == '[' && !inClass) inClass = true;
            else if (c == ']' && inClass) inClass = false;
            if (!inClass && c == '(' && re.startsWith("(?i:", i)) {
                out.append("(?iu:");
                i += 3;
                continue;
            }
            out.append(c);
        }
        return out.toString();
    }
}
