package org.omnidraft.specdecode;

/** An n-gram cache file is unreadable, corrupted, or belongs to another drafter/target pair. */
public class CacheFileException extends CoreException {
    private static final long serialVersionUID = 1L;

    public CacheFileException(String message) {
        super(message);
    }
}
