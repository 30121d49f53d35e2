package org.omnidraft.specdecode;

/**
 * Base of the core's checked errors. The message says what is wrong and how to fix it, so the app
 * can show it to the user as-is.
 */
public class CoreException extends Exception {
    private static final long serialVersionUID = 1L;

    public CoreException(String message) {
        super(message);
    }

    public CoreException(String message, Throwable cause) {
        super(message, cause);
    }
}
