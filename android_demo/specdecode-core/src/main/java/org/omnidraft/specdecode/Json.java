package org.omnidraft.specdecode;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small JSON reader and writer, so the core needs no third-party library on the phone.
 *
 * <p>Objects become {@link LinkedHashMap} (key order kept), arrays {@link ArrayList}, integers
 * without fraction or exponent {@link Long}, other numbers {@link Double}, plus String, Boolean
 * and null. The writer produces what Python's {@code json.dumps(x, separators=(",", ":"))}
 * produces for such values (ASCII-only, \\uXXXX escapes), which the n-gram cache checksum needs.
 */
public final class Json {
    private final String s;
    private int i;

    private Json(String s) {
        this.s = s;
    }

    /** Parses one JSON document; throws {@link IllegalArgumentException} with the offset on bad input. */
    public static Object parse(String text) {
        Json p = new Json(text);
        p.ws();
        Object v = p.value(0);
        p.ws();
        if (p.i != p.s.length()) throw p.error("trailing characters after the JSON value");
        return v;
    }

    private IllegalArgumentException error(String what) {
        return new IllegalArgumentException("invalid JSON at offset " + i + ": " + what);
    }

    private void ws() {
        while (i < s.length()) {
            char c = s.charAt(i);
            if (c == ' ' || c == '\n' || c == '\r' || c == '\t') i++;
            else break;
        }
    }

    private Object value(int depth) {
        if (depth > 512) throw error("nesting too deep");
        if (i >= s.length()) throw error("unexpected end of input");
        char c = s.charAt(i);
        switch (c) {
            case '{': return object(depth);
            case '[': return array(depth);
            case '"': return string();
            case 't': literal("true"); return Boolean.TRUE;
            case 'f': literal("false"); return Boolean.FALSE;
            case 'n': literal("null"); return null;
            default:
                if (c == '-' || (c >= '0' && c <= '9')) return number();
                throw error("unexpected character '" + c + "'");
        }
    }

    private void literal(String word) {
        if (!s.startsWith(word, i)) throw error("expected " + word);
        i += word.length();
    }

    private Map<String, Object> object(int depth) {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        i++;
        ws();
        if (i < s.length() && s.charAt(i) == '}') { i++; return m; }
        while (true) {
            ws();
            if (i >= s.length() || s.charAt(i) != '"') throw error("expected a string key");
            String k = string();
            ws();
            if (i >= s.length() || s.charAt(i) != ':') throw error("expected ':'");
            i++;
            ws();
            m.put(k, value(depth + 1));
            ws();
            if (i >= s.length()) throw error("unexpected end of input in object");
            char c = s.charAt(i++);
            if (c == '}') return m;
            if (c != ',') throw error("expected ',' or '}'");
        }
    }

    private List<Object> array(int depth) {
        List<Object> a = new ArrayList<Object>();
        i++;
        ws();
        if (i < s.length() && s.charAt(i) == ']') { i++; return a; }
        while (true) {
            ws();
            a.add(value(depth + 1));
            ws();
            if (i >= s.length()) throw error("unexpected end of input in array");
            char c = s.charAt(i++);
            if (c == ']') return a;
            if (c != ',') throw error("expected ',' or ']'");
        }
    }

    private String string() {
        i++; // opening quote
        StringBuilder b = null;
        int start = i;
        while (true) {
            if (i >= s.length()) throw error("unterminated string");
            char c = s.charAt(i);
            if (c == '"') {
                String out = b == null ? s.substring(start, i) : b.append(s, start, i).toString();
                i++;
                return out;
            }
            if (c < 0x20) throw error("control character in string");
            if (c != '\\') { i++; continue; }
            if (b == null) b = new StringBuilder();
            b.append(s, start, i);
            if (i + 1 >= s.length()) throw error("unterminated escape");
            char e = s.charAt(i + 1);
            i += 2;
            switch (e) {
                case '"': b.append('"'); break;
                case '\\': b.append('\\'); break;
                case '/': b.append('/'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case 'n': b.append('\n'); break;
                case 'r': b.append('\r'); break;
                case 't': b.append('\t'); break;
                case 'u':
                    if (i + 4 > s.length()) throw error("short \\u escape");
                    try {
                        b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                    } catch (NumberFormatException ex) {
                        throw error("bad \\u escape");
                    }
                    i += 4;
                    break;
                default: throw error("bad escape \\" + e);
            }
            start = i;
        }
    }

    private Object number() {
        int start = i;
        boolean integral = true;
        if (s.charAt(i) == '-') i++;
        int digits = i;
        while (i < s.length() && Character.isDigit(s.charAt(i))) i++;
        if (i == digits) throw error("expected digits");
        if (i < s.length() && s.charAt(i) == '.') {
            integral = false;
            i++;
            int f = i;
            while (i < s.length() && Character.isDigit(s.charAt(i))) i++;
            if (i == f) throw error("expected fraction digits");
        }
        if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
            integral = false;
            i++;
            if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) i++;
            int e = i;
            while (i < s.length() && Character.isDigit(s.charAt(i))) i++;
            if (i == e) throw error("expected exponent digits");
        }
        String t = s.substring(start, i);
        if (integral) {
            try {
                return Long.valueOf(t);
            } catch (NumberFormatException ex) {
                return Double.valueOf(t); // beyond 64 bits: keep it as a double, as a lenient reader would
            }
        }
        return Double.valueOf(t);
    }

    // ---------------------------------------------------------------------------------------------
    // Writer

    /** Compact JSON exactly as Python's {@code json.dumps(v, separators=(",", ":"))} writes it. */
    public static String write(Object v) {
        StringBuilder b = new StringBuilder();
        write(v, b);
        return b.toString();
    }

    @SuppressWarnings("unchecked")
    public static void write(Object v, StringBuilder b) {
        if (v == null) {
            b.append("null");
        } else if (v instanceof String) {
            writeString((String) v, b);
        } else if (v instanceof Boolean) {
            b.append(((Boolean) v) ? "true" : "false");
        } else if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
            b.append(((Number) v).longValue());
        } else if (v instanceof Number) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d)) b.append("NaN");
            else if (Double.isInfinite(d)) b.append(d > 0 ? "Infinity" : "-Infinity");
            else b.append(floatRepr(d));
        } else if (v instanceof Map) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
                if (!first) b.append(',');
                first = false;
                writeString(e.getKey(), b);
                b.append(':');
                write(e.getValue(), b);
            }
            b.append('}');
        } else if (v instanceof List) {
            b.append('[');
            boolean first = true;
            for (Object o : (List<Object>) v) {
                if (!first) b.append(',');
                first = false;
                write(o, b);
            }
            b.append(']');
        } else if (v instanceof int[]) {
            int[] a = (int[]) v;
            b.append('[');
            for (int k = 0; k < a.length; k++) {
                if (k > 0) b.append(',');
                b.append(a[k]);
            }
            b.append(']');
        } else {
            throw new IllegalArgumentException("cannot write " + v.getClass().getName() + " as JSON");
        }
    }

    /** Close to Python's repr for ordinary values; the cache format itself holds integers only. */
    private static String floatRepr(double d) {
        if (d == Math.rint(d) && Math.abs(d) < 1e16) return (long) d + ".0";
        String t = Double.toString(d);
        int e = t.indexOf('E');
        if (e < 0) return t;
        String mant = t.substring(0, e);
        if (mant.endsWith(".0")) mant = mant.substring(0, mant.length() - 2);
        int exp = Integer.parseInt(t.substring(e + 1));
        return mant + "e" + (exp < 0 ? "-" : "+") + (Math.abs(exp) < 10 ? "0" : "") + Math.abs(exp);
    }

    private static void writeString(String str, StringBuilder b) {
        b.append('"');
        for (int k = 0; k < str.length(); k++) {
            char c = str.charAt(k);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                case '\b': b.append("\\b"); break;
                case '\f': b.append("\\f"); break;
                default:
                    if (c < 0x20 || c > 0x7e) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        b.append('"');
    }

    // ---------------------------------------------------------------------------------------------
    // Typed access helpers: a wrong type is reported with the key, not as a ClassCastException.

    @SuppressWarnings("unchecked")
    public static Map<String, Object> asObject(Object v, String what) {
        if (v instanceof Map) return (Map<String, Object>) v;
        throw new IllegalArgumentException(what + " must be a JSON object");
    }

    @SuppressWarnings("unchecked")
    public static List<Object> asArray(Object v, String what) {
        if (v instanceof List) return (List<Object>) v;
        throw new IllegalArgumentException(what + " must be a JSON array");
    }

    public static String asString(Object v, String what) {
        if (v instanceof String) return (String) v;
        throw new IllegalArgumentException(what + " must be a string");
    }

    public static long asLong(Object v, String what) {
        if (v instanceof Long) return (Long) v;
        throw new IllegalArgumentException(what + " must be an integer");
    }

    public static double asDouble(Object v, String what) {
        if (v instanceof Number) return ((Number) v).doubleValue();
        throw new IllegalArgumentException(what + " must be a number");
    }

    public static boolean asBool(Object v, boolean dflt) {
        return v instanceof Boolean ? (Boolean) v : dflt;
    }
}
