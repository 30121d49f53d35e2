package org.omnidraft.specdecode;

/** A tokenizer.json is missing, malformed, or uses a component this core does not implement. */
public class TokenizerException extends CoreException {
    public TokenizerException(String message) {
        super(message);
    }
}
