package org.omnidraft.demo;

import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.omnidraft.specdecode.CoreException;
import org.omnidraft.specdecode.Files8;
import org.omnidraft.specdecode.Json;
import org.omnidraft.specdecode.Utf8;

/**
 * One export folder pushed to the phone: manifest.json (written by {@code omnidraft export}), the
 * {@code .pte} it names and the tokenizer.json it names. Missing files produce a message with the
 * exact adb command that pushes them.
 */
final class ModelFiles {
    /** Where the README tells users to push the exports (readable by apps, as in ExecuTorch's own demos). */
    static final String DEVICE_ROOT = "/data/local/tmp/omnidraft";

    final String role; // "drafter" | "target"
    final File dir;
    final File pte, tokenizer;
    final int vocabSize, maxSeqLen;
    final Set<Integer> eosIds = new HashSet<Integer>();
    /**
     * True for programs of ExecuTorch's LLM lowering (manifest inputs {@code ["tokens", "input_pos"]},
     * the default of {@code omnidraft export --et-path auto} for Llama/Qwen2): they take the start
     * position as a one-element tensor. Otherwise (the static-cache lowering) they take one position
     * per token. Mirrors runtime/backends/executorch.py.
     */
    boolean startPositionOnly;

    private ModelFiles(String role, File dir, File pte, File tokenizer, int vocabSize, int maxSeqLen) {
        this.role = role;
        this.dir = dir;
        this.pte = pte;
        this.tokenizer = tokenizer;
        this.vocabSize = vocabSize;
        this.maxSeqLen = maxSeqLen;
    }

    static String pushCommand(String role) {
        return "adb shell mkdir -p " + DEVICE_ROOT + " && adb push exports/" + role + "-executorch " + DEVICE_ROOT + "/" + role;
    }

    /** Reads and checks {@code <root>/<role>/manifest.json}; throws with the adb command when anything is missing. */
    static ModelFiles open(File root, String role) throws CoreException {
        File dir = new File(root, role);
        File manifest = new File(dir, "manifest.json");
        if (!manifest.isFile()) {
            throw new CoreException("The " + role + " model is missing (no " + manifest + "). Export it with `omnidraft export "
                    + "--format executorch` and push it from your computer:\n" + pushCommand(role));
        }
        Map<String, Object> m;
        try {
            m = Json.asObject(Json.parse(new String(Files8.readAll(manifest), Utf8.UTF8)), "manifest.json");
        } catch (IOException e) {
            throw new CoreException("Cannot read " + manifest + " (" + e.getMessage() + "); push it again:\n" + pushCommand(role));
        } catch (IllegalArgumentException e) {
            throw new CoreException(manifest + " is damaged (" + e.getMessage() + "); push it again:\n" + pushCommand(role));
        }
        if (!"executorch".equals(m.get("format"))) {
            throw new CoreException(manifest + " describes a " + m.get("format") + " export; this app runs ExecuTorch exports "
                    + "(`omnidraft export --format executorch`)");
        }
        try {
            File pte = new File(dir, Json.asString(m.get("artifact_file"), "artifact_file"));
            File tok = new File(dir, Json.asString(m.get("tokenizer_file"), "tokenizer_file"));
            List<String> missing = new ArrayList<String>();
            if (!pte.isFile()) missing.add(pte.getName());
            if (!tok.isFile()) missing.add(tok.getName());
            if (!missing.isEmpty()) {
                throw new CoreException("The " + role + " export in " + dir + " is incomplete (missing " + missing + "); push the "
                        + "whole folder again:\n" + pushCommand(role));
            }
            ModelFiles f = new ModelFiles(role, dir, pte, tok, (int) Json.asLong(m.get("vocab_size"), "vocab_size"),
                    (int) Json.asLong(m.get("max_seq_len"), "max_seq_len"));
            List<Object> inputs = Json.asArray(m.get("inputs"), "inputs");
            f.startPositionOnly = inputs.size() >= 2 && "tokens".equals(inputs.get(0)) && "input_pos".equals(inputs.get(1));
            Object eos = m.get("eos_token_ids");
            if (eos != null) for (Object e : Json.asArray(eos, "eos_token_ids")) f.eosIds.add((int) Json.asLong(e, "eos id"));
            return f;
        } catch (IllegalArgumentException e) {
            throw new CoreException(manifest + " lacks a field (" + e.getMessage() + "); re-export with omnidraft export");
        }
    }
}
