package org.omnidraft.demo;

import java.io.File;
import java.io.IOException;
import java.util.HashSet;
import java.util.Set;
import org.omnidraft.specdecode.CacheFileException;
import org.omnidraft.specdecode.CoreException;
import org.omnidraft.specdecode.DrafterChoice;
import org.omnidraft.specdecode.Model;
import org.omnidraft.specdecode.NgramCache;
import org.omnidraft.specdecode.SpeculativeDecoder;
import org.omnidraft.specdecode.TokenCodec;

/**
 * The loaded pair: the target's ExecuTorch program, the drafter on the runtime the user picked
 * (ExecuTorch XNNPACK, an ExecuTorch delegate, or QNN's HTP through ONNX Runtime), their tokenizers
 * and the n-gram cache. Used on the worker thread only.
 */
final class Engine {
    final SpeculativeDecoder decoder;
    final NgramCache cache;
    final File cacheFile;
    /** Where the drafter runs, as shown in the app (DrafterChoice.label). */
    final String drafterRunsOn;
    private final Model drafter;
    private final ExecuTorchModel target;

    private Engine(SpeculativeDecoder decoder, NgramCache cache, File cacheFile, Model drafter, String drafterRunsOn, ExecuTorchModel target) {
        this.decoder = decoder;
        this.cache = cache;
        this.cacheFile = cacheFile;
        this.drafter = drafter;
        this.drafterRunsOn = drafterRunsOn;
        this.target = target;
    }

    /**
     * Loads the drafter export {@code choice} and {@code root/target}. The cache lives in the app's
     * own storage ({@code cacheFile}); on first start a cache pushed to {@code root/ngram-cache.json} seeds it.
     */
    static Engine load(File root, File cacheFile, Drafters.Option choice) throws CoreException {
        ModelFiles tf = ModelFiles.open(root, "target");
        TokenCodec tc = TokenCodec.load(tf.tokenizer);
        TokenCodec dc;
        Model drafter;
        if (choice.choice.runtime == DrafterChoice.Runtime.EXECUTORCH) {
            ModelFiles df = ModelFiles.open(root, choice.dir.getName());
            dc = TokenCodec.load(df.tokenizer);
            drafter = new ExecuTorchModel(df.pte, df.vocabSize, df.maxSeqLen, df.startPositionOnly);
        } else {
            dc = TokenCodec.load(new File(choice.dir, String.valueOf(choice.manifest.get("tokenizer_file"))));
            drafter = Drafters.openStatic(choice);
        }
        ExecuTorchModel target = new ExecuTorchModel(tf.pte, tf.vocabSize, tf.maxSeqLen, tf.startPositionOnly);
        File seed = new File(root, "ngram-cache.json");
        File source = cacheFile.isFile() ? cacheFile : (seed.isFile() ? seed : null);
        NgramCache cache;
        if (source != null) {
            try {
                cache = NgramCache.load(source, dc.sha256, tc.sha256, drafter.vocabSize(), target.vocabSize(), null, null);
            } catch (CacheFileException e) {
                // A foreign or damaged cache is refused, never silently used; start fresh and say so.
                throw new CacheFileException(e.getMessage() + " (file: " + source + "; the app keeps its cache at " + cacheFile + ")");
            }
        } else {
            cache = new NgramCache(dc.sha256, tc.sha256, drafter.vocabSize(), null, "lfu");
        }
        Set<Integer> eos = tf.eosIds.isEmpty() ? tc.eosIds : new HashSet<Integer>(tf.eosIds);
        SpeculativeDecoder dec = new SpeculativeDecoder(target, tc, eos, drafter, dc, cache);
        return new Engine(dec, cache, cacheFile, drafter, choice.choice.label, target);
    }

    void saveCache() throws IOException {
        cache.save(cacheFile);
    }

    void close() {
        if (drafter instanceof ExecuTorchModel) ((ExecuTorchModel) drafter).close();
        target.close();
    }
}
