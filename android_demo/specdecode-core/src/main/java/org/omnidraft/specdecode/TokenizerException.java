package org.omnidraft.specdecode;

/** A tokenizer.json is missing, malformed, or uses a component this core does not implement. */
public class TokenizerException extends CoreException {
    private static final long serialVersionUID = 1L;

    public TokenizerException(String message) {
        super(message);
    }
}
