package org.omnidraft.specdecode;

import java.io.File;
import java.io.IOException;
import java.text.Normalizer;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A {@code tokenizer.json} (HF {@code tokenizers} format) with the components the two shipped
 * families use: added-token splitting, normalizers Sequence/Prepend/Replace/NFC/NFKC/NFD/NFKD/
 * Lowercase, pre-tokenizers Sequence/Split/ByteLevel, the BPE model, the TemplateProcessing
 * post-processor and decoders Sequence/Replace/ByteFallback/Fuse/Strip/ByteLevel. Anything else is
 * refused with a {@link TokenizerException} rather than tokenized differently from Python.
 */
public final class HfTokenizer {
    /** An entry of {@code added_tokens}. */
    public static final class AddedToken {
        public final int id;
        public final String content;
        public final boolean special, normalized, lstrip, rstrip, singleWord;

        AddedToken(Map<String, Object> m) {
            id = (int) Json.asLong(m.get("id"), "added_tokens.id");
            content = Json.asString(m.get("content"), "added_tokens.content");
            special = Json.asBool(m.get("special"), false);
            normalized = Json.asBool(m.get("normalized"), !special);
            lstrip = Json.asBool(m.get("lstrip"), false);
            rstrip = Json.asBool(m.get("rstrip"), false);
            singleWord = Json.asBool(m.get("single_word"), false);
        }
    }

    private final Map<String, Object> spec;
    private final BpeModel model;
    private final List<AddedToken> added = new ArrayList<AddedToken>();
    private final Map<Integer, AddedToken> addedById = new HashMap<Integer, AddedToken>();
    private final Map<String, Integer> addedByContent = new HashMap<String, Integer>();
    private final Object normalizer, preTokenizer, postProcessor, decoder;

    private HfTokenizer(Map<String, Object> spec) throws TokenizerException {
        this.spec = spec;
        try {
            model = new BpeModel(Json.asObject(spec.get("model"), "model"));
            Object at = spec.get("added_tokens");
            if (at != null) {
                for (Object o : Json.asArray(at, "added_tokens")) {
                    AddedToken t = new AddedToken(Json.asObject(o, "added token"));
                    added.add(t);
                    addedById.put(t.id, t);
                    addedByContent.put(t.content, t.id);
                }
            }
            normalizer = spec.get("normalizer");
            preTokenizer = spec.get("pre_tokenizer");
            postProcessor = spec.get("post_processor");
            decoder = spec.get("decoder");
            // Validate every component now, so an unsupported file fails at load, not mid-generation.
            checkComponent(normalizer, "normalizer", NORMALIZERS);
            checkComponent(preTokenizer, "pre_tokenizer", PRE_TOKENIZERS);
            checkComponent(postProcessor, "post_processor", POST_PROCESSORS);
            checkComponent(decoder, "decoder", DECODERS);
            compiledSplits = new HashMap<Object, Pattern>();
        } catch (IllegalArgumentException e) {
            throw new TokenizerException("malformed tokenizer.json (" + e.getMessage() + "); re-export it with HF tokenizers");
        }
    }

    private static final Set<String> NORMALIZERS = set("Sequence", "Prepend", "Replace", "NFC", "NFKC", "NFD", "NFKD", "Lowercase");
    private static final Set<String> PRE_TOKENIZERS = set("Sequence", "Split", "ByteLevel");
    private static final Set<String> POST_PROCESSORS = set("TemplateProcessing", "ByteLevel");
    private static final Set<String> DECODERS = set("Sequence", "Replace", "ByteFallback", "Fuse", "Strip", "ByteLevel");

    private static Set<String> set(String... names) {
        Set<String> s = new HashSet<String>();
        Collections.addAll(s, names);
        return s;
    }

    private static void checkComponent(Object node, String where, Set<String> allowed) throws TokenizerException {
        if (node == null) return;
        Map<String, Object> m = Json.asObject(node, where);
        String type = String.valueOf(m.get("type"));
        if (!allowed.contains(type)) {
            throw new TokenizerException("unsupported " + where + " '" + type + "' in tokenizer.json; this core handles "
                    + allowed + " (SentencePiece-BPE and byte-level BPE tokenizers)");
        }
        for (String child : new String[] {"normalizers", "pretokenizers", "decoders"}) {
            Object list = m.get(child);
            if (list != null) for (Object o : Json.asArray(list, where + "." + child)) checkComponent(o, where, allowed);
        }
        if ("Split".equals(type)) {
            String behavior = String.valueOf(m.get("behavior"));
            if (!"Isolated".equals(behavior) || Json.asBool(m.get("invert"), false)) {
                throw new TokenizerException("Split pre-tokenizer with behavior " + behavior + " is not supported (only Isolated)");
            }
        }
        if ("Replace".equals(type) && !(Json.asObject(m.get("pattern"), "Replace.pattern").get("String") instanceof String)) {
            throw new TokenizerException("Replace with a regex pattern is not supported (only a plain string)");
        }
    }

    public static HfTokenizer fromJson(String json) throws TokenizerException {
        Object doc;
        try {
            doc = Json.parse(json);
        } catch (IllegalArgumentException e) {
            throw new TokenizerException("not a tokenizer.json: " + e.getMessage() + "; copy the model's tokenizer.json again");
        }
        if (!(doc instanceof Map) || !(((Map<?, ?>) doc).get("model") instanceof Map)) {
            throw new TokenizerException("not a tokenizer.json (no \"model\" object); copy the model's tokenizer.json again");
        }
        return new HfTokenizer(Json.asObject(doc, "tokenizer.json"));
    }

    public static HfTokenizer load(File file) throws TokenizerException {
        return fromJson(readText(file));
    }

    static String readText(File file) throws TokenizerException {
        try {
            return new String(Files8.readAll(file), Utf8.UTF8);
        } catch (IOException e) {
            throw new TokenizerException("cannot read tokenizer " + file + " (" + e.getMessage() + "); push it to the device "
                    + "or check the path");
        }
    }

    Map<String, Object> spec() {
        return spec;
    }

    public List<AddedToken> addedTokens() {
        return Collections.unmodifiableList(added);
    }

    /** Token string of an id (added tokens first, as HF does), or null. */
    public String idToToken(int id) {
        AddedToken t = addedById.get(id);
        if (t != null) return t.content;
        return id >= 0 && id < model.idToToken.length ? model.idToToken[id] : null;
    }

    public Integer tokenToId(String token) {
        Integer id = addedByContent.get(token);
        return id != null ? id : model.vocab.get(token);
    }

    /** Number of ids, added tokens included ({@code max id + 1}). */
    public int vocabSize() {
        int max = model.idToToken.length - 1;
        for (AddedToken t : added) max = Math.max(max, t.id);
        return max + 1;
    }

    public boolean isSpecial(int id) {
        AddedToken t = addedById.get(id);
        return t != null && t.special;
    }

    // ---------------------------------------------------------------------------------------------
    // Encoding

    public int[] encode(String text, boolean addSpecialTokens) {
        IntList out = new IntList(text.length() / 2 + 4);
        if (addSpecialTokens) template(out, true);
        // 1. added tokens that match on raw text; 2. normalize the rest; 3. added tokens on normalized text.
        List<Object> raw = splitAdded(text, false);
        for (Object seg : raw) {
            if (seg instanceof Integer) {
                out.add((Integer) seg);
                continue;
            }
            String norm = normalize(normalizer, (String) seg);
            for (Object part : splitAdded(norm, true)) {
                if (part instanceof Integer) {
                    out.add((Integer) part);
                    continue;
                }
                List<String> pieces = new ArrayList<String>();
                pieces.add((String) part);
                pieces = preTokenize(preTokenizer, pieces);
                for (String p : pieces) model.tokenize(p, out);
            }
        }
        if (addSpecialTokens) {
            IntList withTail = new IntList(out.size() + 4);
            withTail.addAll(out);
            template(withTail, false);
            return withTail.toArray();
        }
        return out.toArray();
    }

    /** Segments: String for text, Integer for a matched added token (leftmost-longest, as aho-corasick). */
    private List<Object> splitAdded(String text, boolean normalizedPass) {
        List<Object> out = new ArrayList<Object>();
        List<AddedToken> cands = new ArrayList<AddedToken>();
        for (AddedToken t : added) if (t.normalized == normalizedPass && !t.content.isEmpty()) cands.add(t);
        if (cands.isEmpty()) {
            if (!text.isEmpty()) out.add(text);
            return out;
        }
        int start = 0, i = 0;
        while (i < text.length()) {
            AddedToken best = null;
            for (AddedToken t : cands) {
                if (text.startsWith(t.content, i) && (best == null || t.content.length() > best.content.length())) {
                    if (t.singleWord && !isWordBoundary(text, i, i + t.content.length())) continue;
                    best = t;
                }
            }
            if (best == null) {
                i++;
                continue;
            }
            int ms = i, me = i + best.content.length();
            if (best.lstrip) while (ms > start && Character.isWhitespace(text.charAt(ms - 1))) ms--;
            if (best.rstrip) while (me < text.length() && Character.isWhitespace(text.charAt(me))) me++;
            if (ms > start) out.add(text.substring(start, ms));
            out.add(best.id);
            start = i = me;
        }
        if (start < text.length()) out.add(text.substring(start));
        return out;
    }

    private static boolean isWordBoundary(String s, int from, int to) {
        boolean left = from == 0 || !Character.isLetterOrDigit(s.charAt(from - 1));
        boolean right = to >= s.length() || !Character.isLetterOrDigit(s.charAt(to));
        return left && right;
    }

    private static String normalize(Object node, String s) {
        if (node == null) return s;
        Map<String, Object> m = Json.asObject(node, "normalizer");
        String type = (String) m.get("type");
        if ("Sequence".equals(type)) {
            for (Object child : Json.asArray(m.get("normalizers"), "normalizers")) s = normalize(child, s);
            return s;
        }
        if ("Prepend".equals(type)) return s.isEmpty() ? s : Json.asString(m.get("prepend"), "prepend") + s;
        if ("Replace".equals(type)) {
            String pat = Json.asString(Json.asObject(m.get("pattern"), "pattern").get("String"), "pattern");
            return pat.isEmpty() ? s : s.replace(pat, Json.asString(m.get("content"), "content"));
        }
        if ("NFC".equals(type)) return Normalizer.normalize(s, Normalizer.Form.NFC);
        if ("NFKC".equals(type)) return Normalizer.normalize(s, Normalizer.Form.NFKC);
        if ("NFD".equals(type)) return Normalizer.normalize(s, Normalizer.Form.NFD);
        if ("NFKD".equals(type)) return Normalizer.normalize(s, Normalizer.Form.NFKD);
        if ("Lowercase".equals(type)) return s.toLowerCase(java.util.Locale.ROOT);
        throw new IllegalStateException("unchecked normalizer " + type);
    }

    private final Map<Object, Pattern> compiledSplits;

    private List<String> preTokenize(Object node, List<String> pieces) {
        if (node == null) return pieces;
        Map<String, Object> m = Json.asObject(node, "pre_tokenizer");
        String type = (String) m.get("type");
        if ("Sequence".equals(type)) {
            for (Object child : Json.asArray(m.get("pretokenizers"), "pretokenizers")) pieces = preTokenize(child, pieces);
            return pieces;
        }
        List<String> out = new ArrayList<String>();
        if ("Split".equals(type)) {
            Pattern re = splitPattern(m);
            for (String p : pieces) isolate(re, p, out);
            return out;
        }
        if ("ByteLevel".equals(type)) {
            boolean prefix = Json.asBool(m.get("add_prefix_space"), true);
            boolean useRegex = Json.asBool(m.get("use_regex"), true);
            for (String p : pieces) {
                if (prefix && !p.startsWith(" ")) p = " " + p;
                List<String> parts = new ArrayList<String>();
                if (useRegex) isolate(GPT2_PATTERN, p, parts);
                else parts.add(p);
                for (String q : parts) out.add(ByteLevel.toUnicode(Utf8.encode(q)));
            }
            return out;
        }
        throw new IllegalStateException("unchecked pre_tokenizer " + type);
    }

    private Pattern splitPattern(Map<String, Object> m) {
        Pattern re = compiledSplits.get(m);
        if (re != null) return re;
        Map<String, Object> pat = Json.asObject(m.get("pattern"), "Split.pattern");
        if (pat.get("Regex") instanceof String) re = Pattern.compile(OnigRegex.toJava((String) pat.get("Regex")));
        else re = Pattern.compile(Pattern.quote(Json.asString(pat.get("String"), "Split.pattern.String")));
        compiledSplits.put(m, re);
        return re;
    }

    /** Split with behavior "Isolated": every match and every gap between matches is its own piece. */
    private static void isolate(Pattern re, String s, List<String> out) {
        Matcher mt = re.matcher(s);
        int last = 0;
        while (mt.find()) {
            if (mt.end() == mt.start()) continue; // empty matches split nothing
            if (mt.start() > last) out.add(s.substring(last, mt.start()));
            out.add(s.substring(mt.start(), mt.end()));
            last = mt.end();
        }
        if (last < s.length()) out.add(s.substring(last));
    }

    static final Pattern GPT2_PATTERN = Pattern.compile(OnigRegex.toJava(
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"));

    /** Appends the template's special ids before ({@code head}) or after the sequence. */
    private void template(IntList out, boolean head) {
        if (postProcessor == null) return;
        Map<String, Object> m = Json.asObject(postProcessor, "post_processor");
        if (!"TemplateProcessing".equals(m.get("type"))) return;
        Map<String, Object> specials = Json.asObject(m.get("special_tokens"), "special_tokens");
        boolean beforeSeq = true;
        for (Object item : Json.asArray(m.get("single"), "single")) {
            Map<String, Object> it = Json.asObject(item, "template item");
            if (it.containsKey("Sequence")) {
                beforeSeq = false;
                continue;
            }
            if (beforeSeq != head) continue;
            String id = Json.asString(Json.asObject(it.get("SpecialToken"), "SpecialToken").get("id"), "SpecialToken.id");
            for (Object x : Json.asArray(Json.asObject(specials.get(id), "special token " + id).get("ids"), "ids")) {
                out.add((int) Json.asLong(x, "special id"));
            }
        }
    }

    // ---------------------------------------------------------------------------------------------
    // Decoding (HF semantics: token strings through the decoder chain)

    public String decode(int[] ids, boolean skipSpecialTokens) {
        List<String> tokens = new ArrayList<String>(ids.length);
        for (int id : ids) {
            String t = idToToken(id);
            if (t == null) continue;
            if (skipSpecialTokens && isSpecial(id)) continue;
            tokens.add(t);
        }
        if (decoder == null) {
            StringBuilder b = new StringBuilder();
            for (int k = 0; k < tokens.size(); k++) {
                if (k > 0) b.append(' ');
                b.append(tokens.get(k));
            }
            return b.toString();
        }
        tokens = decodeChain(decoder, tokens);
        StringBuilder b = new StringBuilder();
        for (String t : tokens) b.append(t);
        return b.toString();
    }

    private static List<String> decodeChain(Object node, List<String> tokens) {
        Map<String, Object> m = Json.asObject(node, "decoder");
        String type = (String) m.get("type");
        List<String> out = new ArrayList<String>(tokens.size());
        if ("Sequence".equals(type)) {
            for (Object child : Json.asArray(m.get("decoders"), "decoders")) tokens = decodeChain(child, tokens);
            return tokens;
        }
        if ("Replace".equals(type)) {
            String pat = Json.asString(Json.asObject(m.get("pattern"), "pattern").get("String"), "pattern");
            String content = Json.asString(m.get("content"), "content");
            for (String t : tokens) out.add(pat.isEmpty() ? t : t.replace(pat, content));
            return out;
        }
        if ("ByteFallback".equals(type)) {
            java.io.ByteArrayOutputStream pending = new java.io.ByteArrayOutputStream();
            for (String t : tokens) {
                int b = byteToken(t);
                if (b >= 0) {
                    pending.write(b);
                    continue;
                }
                flushBytes(pending, out);
                out.add(t);
            }
            flushBytes(pending, out);
            return out;
        }
        if ("Fuse".equals(type)) {
            StringBuilder b = new StringBuilder();
            for (String t : tokens) b.append(t);
            out.add(b.toString());
            return out;
        }
        if ("Strip".equals(type)) {
            String content = Json.asString(m.get("content"), "content");
            int start = (int) Json.asLong(m.get("start"), "start"), stop = (int) Json.asLong(m.get("stop"), "stop");
            int c = content.codePointAt(0);
            for (String t : tokens) {
                int[] cps = t.codePoints().toArray();
                int from = 0, to = cps.length;
                while (from < Math.min(start, cps.length) && cps[from] == c) from++;
                for (int k = 0; k < stop && to > from && cps[to - 1] == c; k++) to--;
                out.add(new String(cps, from, to - from));
            }
            return out;
        }
        if ("ByteLevel".equals(type)) {
            java.io.ByteArrayOutputStream bytes = new java.io.ByteArrayOutputStream();
            for (String t : tokens) {
                byte[] b = ByteLevel.toBytes(t);
                if (b == null) b = Utf8.encode(t);
                bytes.write(b, 0, b.length);
            }
            out.add(Utf8.decodeLossy(bytes.toByteArray()));
            return out;
        }
        throw new IllegalStateException("unchecked decoder " + type);
    }

    /** The byte of a {@code <0xNN>} token, or -1. */
    static int byteToken(String t) {
        if (t.length() != 6 || !t.startsWith("<0x") || t.charAt(5) != '>') return -1;
        try {
            return Integer.parseInt(t.substring(3, 5), 16);
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    private static void flushBytes(java.io.ByteArrayOutputStream pending, List<String> out) {
        if (pending.size() == 0) return;
        byte[] b = pending.toByteArray();
        pending.reset();
        if (Utf8.isValid(b, 0, b.length)) {
            out.add(new String(b, Utf8.UTF8));
        } else {
            for (int k = 0; k < b.length; k++) out.add("\uFFFD");
        }
    }
}
