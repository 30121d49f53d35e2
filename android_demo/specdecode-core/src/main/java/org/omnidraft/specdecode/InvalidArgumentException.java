package org.omnidraft.specdecode;

/** A user setting or input is out of range (bad K, temperature, empty prompt, prompt too long). */
public class InvalidArgumentException extends CoreException {
    private static final long serialVersionUID = 1L;

    public InvalidArgumentException(String message) {
        super(message);
    }
}
