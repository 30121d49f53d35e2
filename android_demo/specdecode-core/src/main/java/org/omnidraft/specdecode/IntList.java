package org.omnidraft.specdecode;

import java.util.Arrays;

/** A growable int array (the core avoids boxed lists on hot paths). */
public final class IntList {
    private int[] a;
    private int n;

    public IntList() {
        this(16);
    }

    public IntList(int capacity) {
        a = new int[Math.max(4, capacity)];
    }

    public static IntList of(int... values) {
        IntList l = new IntList(values.length);
        l.addAll(values);
        return l;
    }

    public void add(int v) {
        if (n == a.length) a = Arrays.copyOf(a, a.length * 2);
        a[n++] = v;
    }

    public void addAll(int[] vs) {
        for (int v : vs) add(v);
    }

    public void addAll(IntList vs) {
        for (int k = 0; k < vs.n; k++) add(vs.a[k]);
    }

    public int get(int i) {
        if (i < 0 || i >= n) throw new IndexOutOfBoundsException(i + " of " + n);
        return a[i];
    }

    public void set(int i, int v) {
        if (i < 0 || i >= n) throw new IndexOutOfBoundsException(i + " of " + n);
        a[i] = v;
    }

    public int size() {
        return n;
    }

    public boolean isEmpty() {
        return n == 0;
    }

    public void truncate(int size) {
        if (size < n) n = Math.max(0, size);
    }

    public void clear() {
        n = 0;
    }

    public int last() {
        return get(n - 1);
    }

    public int[] toArray() {
        return Arrays.copyOf(a, n);
    }

    public int[] slice(int from, int to) {
        return Arrays.copyOfRange(a, from, to);
    }

    @Override
    public String toString() {
        return Arrays.toString(toArray());
    }
}
