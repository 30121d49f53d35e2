package org.omnidraft.specdecode;

import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Comparator;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.PriorityQueue;

/**
 * The online n-gram cache: drafter sub-token sequences to the one target token they spell (mirror
 * of {@code runtime/ngram_cache.py}, same JSON file and the same LFU/LRU eviction order).
 *
 * <p>File: {@code {"format":"omnidraft.ngram-cache","version":1,"drafter_tokenizer":sha256,
 * "target_tokenizer":sha256,"capacity":int|null,"policy":"lfu"|"lru","clock":int,
 * "entries":[[[d1,...,dn],t,seen,hits,last_used],...],"checksum":sha256(json(entries))}}.
 */
public final class NgramCache {
    public static final String FORMAT = "omnidraft.ngram-cache";
    public static final int VERSION = 1;

    /** An n-gram key: a drafter id sequence with value equality and Python tuple ordering. */
    public static final class Key implements Comparable<Key> {
        final int[] ids;
        private final int hash;

        public Key(int[] ids) {
            this.ids = ids.clone();
            this.hash = Arrays.hashCode(this.ids);
        }

        public int length() {
            return ids.length;
        }

        public int[] ids() {
            return ids.clone();
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Key && Arrays.equals(ids, ((Key) o).ids);
        }

        @Override
        public int hashCode() {
            return hash;
        }

        @Override
        public int compareTo(Key o) {
            int n = Math.min(ids.length, o.ids.length);
            for (int i = 0; i < n; i++) if (ids[i] != o.ids[i]) return ids[i] < o.ids[i] ? -1 : 1;
            return ids.length - o.ids.length;
        }

        @Override
        public String toString() {
            return Arrays.toString(ids);
        }
    }

    private static final class Entry {
        int target;
        long seen, hits, lastUsed;
    }

    private static final class HeapItem {
        final long rank, last;
        final Key key;

        HeapItem(long rank, long last, Key key) {
            this.rank = rank;
            this.last = last;
            this.key = key;
        }
    }

    private static final Comparator<HeapItem> HEAP_ORDER = new Comparator<HeapItem>() {
        @Override
        public int compare(HeapItem a, HeapItem b) {
            if (a.rank != b.rank) return a.rank < b.rank ? -1 : 1;
            if (a.last != b.last) return a.last < b.last ? -1 : 1;
            return a.key.compareTo(b.key);
        }
    };

    public final String drafterTokenizer, targetTokenizer;
    public final Integer capacity; // null: unbounded
    public final String policy;
    private long clock;
    private int maxLen;
    private long version; // bumped whenever the key set changes
    private final LinkedHashMap<Key, Entry> entries = new LinkedHashMap<Key, Entry>();
    private final int[] refs; // how many keys use each drafter id
    private PriorityQueue<HeapItem> heap = new PriorityQueue<HeapItem>(64, HEAP_ORDER);

    public NgramCache(String drafterTokenizer, String targetTokenizer, int drafterWidth, Integer capacity, String policy) {
        if (capacity != null && capacity < 1) {
            throw new IllegalArgumentException("n-gram cache capacity must be >= 1 (got " + capacity + "); omit it for an unbounded cache");
        }
        if (!"lfu".equals(policy) && !"lru".equals(policy)) {
            throw new IllegalArgumentException("unknown eviction policy '" + policy + "'; choose one of lfu, lru");
        }
        this.drafterTokenizer = drafterTokenizer;
        this.targetTokenizer = targetTokenizer;
        this.capacity = capacity;
        this.policy = policy;
        this.refs = new int[drafterWidth];
    }

    // -- queries ----------------------------------------------------------------------------------

    public int size() {
        return entries.size();
    }

    public boolean contains(Key key) {
        return entries.containsKey(key);
    }

    /** Target id of {@code key}, or -1. */
    public int get(Key key) {
        Entry e = entries.get(key);
        return e == null ? -1 : e.target;
    }

    public long clock() {
        return clock;
    }

    public int maxLen() {
        return maxLen;
    }

    public long version() {
        return version;
    }

    /** True for drafter ids that appear in some key. */
    public boolean usesDrafterToken(int id) {
        return id >= 0 && id < refs.length && refs[id] > 0;
    }

    /** (key, target, seen, hits, lastUsed) of every entry, in insertion order. */
    public List<long[]> snapshot() {
        List<long[]> out = new ArrayList<long[]>();
        for (Map.Entry<Key, Entry> e : entries.entrySet()) {
            long[] row = new long[e.getKey().ids.length + 4];
            for (int i = 0; i < e.getKey().ids.length; i++) row[i] = e.getKey().ids[i];
            Entry v = e.getValue();
            row[row.length - 4] = v.target;
            row[row.length - 3] = v.seen;
            row[row.length - 2] = v.hits;
            row[row.length - 1] = v.lastUsed;
            out.add(row);
        }
        return out;
    }

    // -- updates ----------------------------------------------------------------------------------

    /** Records one occurrence of {@code key} spelling {@code target}; true if the key is new. */
    public boolean observe(Key key, int target) {
        clock++;
        Entry e = entries.get(key);
        if (e != null) {
            if (e.target == target) {
                e.seen++;
                e.lastUsed = clock;
                push(key, e);
                return false;
            }
            remove(key); // the same sub-tokens now spell another target token: keep the newest
        }
        if (capacity != null && entries.size() >= capacity) evict();
        e = new Entry();
        e.target = target;
        e.seen = 1;
        e.hits = 0;
        e.lastUsed = clock;
        entries.put(key, e);
        for (int d : key.ids) refs[d]++;
        maxLen = Math.max(maxLen, key.ids.length);
        version++;
        push(key, e);
        return true;
    }

    /** The target accepted this n-gram in verification. */
    public void recordHit(Key key) {
        Entry e = entries.get(key);
        if (e != null) {
            clock++;
            e.hits++;
            e.lastUsed = clock;
            push(key, e);
        }
    }

    private long rank(Entry e) {
        return "lfu".equals(policy) ? e.seen + e.hits : e.lastUsed;
    }

    private void push(Key key, Entry e) {
        if (capacity == null) return;
        heap.add(new HeapItem(rank(e), e.lastUsed, key));
        if (heap.size() > 4L * capacity + 64) {
            PriorityQueue<HeapItem> fresh = new PriorityQueue<HeapItem>(entries.size() + 16, HEAP_ORDER);
            for (Map.Entry<Key, Entry> x : entries.entrySet()) fresh.add(new HeapItem(rank(x.getValue()), x.getValue().lastUsed, x.getKey()));
            heap = fresh;
        }
    }

    private void evict() {
        while (!heap.isEmpty()) {
            HeapItem it = heap.poll();
            Entry e = entries.get(it.key);
            if (e != null && rank(e) == it.rank && e.lastUsed == it.last) {
                remove(it.key);
                return;
            }
        }
        // Heap exhausted by stale items: fall back to a scan (rare).
        Key best = null;
        Entry be = null;
        for (Map.Entry<Key, Entry> x : entries.entrySet()) {
            Entry e = x.getValue();
            if (be == null || rank(e) < rank(be) || (rank(e) == rank(be) && e.lastUsed < be.lastUsed)) {
                best = x.getKey();
                be = e;
            }
        }
        if (best != null) remove(best);
    }

    private void remove(Key key) {
        entries.remove(key);
        for (int d : key.ids) refs[d]--;
        version++;
    }

    // -- persistence ------------------------------------------------------------------------------

    private List<Object> entriesJson() {
        List<Object> out = new ArrayList<Object>(entries.size());
        for (Map.Entry<Key, Entry> x : entries.entrySet()) {
            List<Object> row = new ArrayList<Object>(5);
            List<Object> k = new ArrayList<Object>(x.getKey().ids.length);
            for (int d : x.getKey().ids) k.add((long) d);
            Entry e = x.getValue();
            row.add(k);
            row.add((long) e.target);
            row.add(e.seen);
            row.add(e.hits);
            row.add(e.lastUsed);
            out.add(row);
        }
        return out;
    }

    /** The file's bytes (byte-identical to what the Python runtime writes for the same state). */
    public byte[] serialise() {
        List<Object> ents = entriesJson();
        Map<String, Object> doc = new LinkedHashMap<String, Object>();
        doc.put("format", FORMAT);
        doc.put("version", (long) VERSION);
        doc.put("drafter_tokenizer", drafterTokenizer);
        doc.put("target_tokenizer", targetTokenizer);
        doc.put("capacity", capacity == null ? null : (Object) (long) capacity);
        doc.put("policy", policy);
        doc.put("clock", clock);
        doc.put("entries", ents);
        doc.put("checksum", checksum(ents));
        return Json.write(doc).getBytes(Utf8.UTF8);
    }

    public long nbytes() {
        return serialise().length;
    }

    static String checksum(List<Object> entries) {
        return Files8.sha256Hex(Json.write(entries).getBytes(Utf8.UTF8));
    }

    /** Writes atomically: a crash mid-write leaves the previous file intact. */
    public void save(File path) throws IOException {
        Files8.writeAtomic(path, serialise());
    }

    /** Loads a cache saved for exactly this (drafter, target) tokenizer pair. */
    public static NgramCache load(File path, String drafterTokenizer, String targetTokenizer, int drafterWidth,
                                  int targetWidth, Integer capacity, String policy) throws CacheFileException {
        String hint = "delete it to start a fresh cache";
        Object parsed;
        try {
            parsed = Json.parse(new String(Files8.readAll(path), Utf8.UTF8));
        } catch (IOException e) {
            throw new CacheFileException("n-gram cache " + path + " is unreadable or not JSON (" + e.getMessage() + "); " + hint);
        } catch (IllegalArgumentException e) {
            throw new CacheFileException("n-gram cache " + path + " is unreadable or not JSON (" + e.getMessage() + "); " + hint);
        }
        if (!(parsed instanceof Map)) {
            throw new CacheFileException(path + " is not an omnidraft n-gram cache (format " + FORMAT + " v" + VERSION + "); " + hint);
        }
        Map<String, Object> doc = Json.asObject(parsed, "cache");
        if (!FORMAT.equals(doc.get("format")) || !Long.valueOf(VERSION).equals(doc.get("version"))) {
            throw new CacheFileException(path + " is not an omnidraft n-gram cache (format " + FORMAT + " v" + VERSION + "); " + hint);
        }
        if (!drafterTokenizer.equals(doc.get("drafter_tokenizer")) || !targetTokenizer.equals(doc.get("target_tokenizer"))) {
            throw new CacheFileException("n-gram cache " + path + " was built for another drafter/target tokenizer pair; "
                    + "use the cache of this pair or " + hint);
        }
        Object ents = doc.get("entries");
        if (!(ents instanceof List) || !checksum(Json.asArray(ents, "entries")).equals(doc.get("checksum"))) {
            throw new CacheFileException("n-gram cache " + path + " is corrupted (checksum mismatch); " + hint);
        }
        Integer cap = capacity;
        if (cap == null && doc.get("capacity") instanceof Long) cap = (int) (long) (Long) doc.get("capacity");
        String pol = policy != null ? policy : (doc.get("policy") instanceof String ? (String) doc.get("policy") : "lfu");
        NgramCache cache;
        try {
            cache = new NgramCache(drafterTokenizer, targetTokenizer, drafterWidth, cap, pol);
        } catch (IllegalArgumentException e) {
            throw new CacheFileException("n-gram cache " + path + ": " + e.getMessage());
        }
        try {
            List<Object> rows = new ArrayList<Object>(Json.asArray(ents, "entries"));
            // Replay in recency order (stable sort, as Python's sorted) so eviction state matches.
            final List<Object> view = rows;
            Collections.sort(view, new Comparator<Object>() {
                @Override
                public int compare(Object a, Object b) {
                    long x = Json.asLong(Json.asArray(a, "entry").get(4), "last_used");
                    long y = Json.asLong(Json.asArray(b, "entry").get(4), "last_used");
                    return x < y ? -1 : (x == y ? 0 : 1);
                }
            });
            for (Object r : rows) {
                List<Object> row = Json.asArray(r, "entry");
                if (row.size() != 5) throw new IllegalArgumentException("an entry must have 5 fields");
                List<Object> k = Json.asArray(row.get(0), "key");
                long target = Json.asLong(row.get(1), "target");
                if (k.isEmpty()) throw new IllegalArgumentException("id out of range");
                int[] ids = new int[k.size()];
                for (int i = 0; i < ids.length; i++) {
                    long d = Json.asLong(k.get(i), "drafter id");
                    if (d < 0 || d >= drafterWidth) throw new IllegalArgumentException("id out of range");
                    ids[i] = (int) d;
                }
                if (target < 0 || target >= targetWidth) throw new IllegalArgumentException("id out of range");
                Key key = new Key(ids);
                cache.observe(key, (int) target);
                Entry e = cache.entries.get(key);
                if (e != null) {
                    e.seen = Json.asLong(row.get(2), "seen");
                    e.hits = Json.asLong(row.get(3), "hits");
                    e.lastUsed = Json.asLong(row.get(4), "last_used");
                    cache.push(key, e);
                }
            }
        } catch (IllegalArgumentException e) {
            throw new CacheFileException("n-gram cache " + path + " has a malformed entry (" + e.getMessage() + "); " + hint);
        }
        Object c = doc.get("clock");
        long fileClock = c instanceof Long ? (Long) c : 0L;
        cache.clock = Math.max(fileClock, cache.clock);
        return cache;
    }

    /** Iterates keys in insertion order (tests and the app's cache view). */
    public Iterator<Key> keys() {
        return Collections.unmodifiableSet(entries.keySet()).iterator();
    }
}
