package org.omnidraft.specdecode;

import java.io.ByteArrayOutputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Set;

/**
 * Cross-vocabulary speculative decoding (mirror of {@code runtime/speculative.py}, paper Algorithm
 * 1). One round: draft k drafter tokens, translate them to m target tokens, verify all m with one
 * target call, accept (greedy: argmax match; sampling: u * q' < p), add a correction (residual with
 * the Eq. 2 prefix correction) or bonus token, roll both KV caches back, re-tokenize the accepted
 * text for the drafter and update the n-gram cache. Models are reached only through {@link Model}.
 */
public final class SpeculativeDecoder {
    /** Streaming callbacks; called on the decoding thread. */
    public interface Listener {
        void onText(String delta);

        void onRound(DecodeStats stats);
    }

    /** What one round did (the Python trace's fields). */
    public static final class Round {
        public int[] draft, targetIds, committed;
        public int[] context; // the drafter's token ids when the round began (its KV cache holds a prefix of them)
        public int[][] spans;
        public boolean[] merged;
        public int accepted, extra, ngramAdded, drafterCacheKept;
        public double[] uniforms; // draws of this round, as the Python trace lists them (not the bonus draw)
    }

    public static final class Result {
        public final String text;
        public final int[] tokenIds;
        public final DecodeStats stats;
        public final List<Round> rounds;

        Result(String text, int[] tokenIds, DecodeStats stats, List<Round> rounds) {
            this.text = text;
            this.tokenIds = tokenIds;
            this.stats = stats;
            this.rounds = rounds;
        }
    }

    /**
     * The sampling acceptance rule, swappable only so tests can prove the vectors catch a wrong one.
     * The standard rule takes q' from Eq. 1 (a merged n-gram's q' is the product over its
     * sub-tokens), accepts with probability min(1, p/q') (as u * q' < p) and draws the correction
     * from norm(max(0, p - q')) with q' corrected by Eq. 2.
     */
    public interface AcceptanceRule {
        boolean accept(double u, double qPrime, double p);

        /** q'(t_j) for the acceptance test (Eq. 1). */
        default double proposalProb(int j, Translate.Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab) {
            return Translate.proposalProb(j, tr, draft, qRows, vocab);
        }

        double[] correction(double[] p, int j, Translate.Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab);
    }

    public static final AcceptanceRule STANDARD_RULE = new AcceptanceRule() {
        @Override
        public boolean accept(double u, double qPrime, double p) {
            return u * qPrime < p;
        }

        @Override
        public double[] correction(double[] p, int j, Translate.Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab) {
            return Sampling.residual(p, Translate.qPrimeFull(j, tr, draft, qRows, vocab, p.length));
        }
    };

    private AcceptanceRule rule = STANDARD_RULE;

    void setAcceptanceRule(AcceptanceRule rule) {
        this.rule = rule;
    }

    public final Model target, drafter;
    public final TokenCodec targetCodec, drafterCodec;
    public final NgramCache cache;
    public final VocabMap vocab;
    private final Set<Integer> eos;
    private boolean[] mask;
    private String maskKey;

    /** {@code drafter}/{@code drafterCodec}/{@code cache} may be null for target-only decoding. */
    public SpeculativeDecoder(Model target, TokenCodec targetCodec, Set<Integer> eosIds, Model drafter,
                              TokenCodec drafterCodec, NgramCache cache) {
        this.target = target;
        this.targetCodec = targetCodec;
        this.eos = eosIds;
        this.drafter = drafter;
        this.drafterCodec = drafterCodec;
        this.cache = cache;
        this.vocab = drafter == null ? null
                : VocabMap.build(drafterCodec, targetCodec, drafter.vocabSize(), target.vocabSize());
    }

    /** Drafter tokens that can be translated: the direct map, plus n-gram sub-tokens in ngram mode. */
    boolean[] draftMask(String mode) {
        String key = mode + "/" + (cache != null ? cache.version() : -1);
        if (!key.equals(maskKey)) {
            boolean[] m = vocab.dmMask().clone();
            if (DecodeConfig.NGRAM.equals(mode) && cache != null) {
                for (int d = 0; d < m.length; d++) if (cache.usesDrafterToken(d)) m[d] = true;
            }
            mask = m;
            maskKey = key;
        }
        return mask;
    }

    public Result generate(String prompt, DecodeConfig cfg, Uniforms rng, Listener listener, boolean trace)
            throws CoreException {
        cfg.validate();
        if (prompt.isEmpty()) throw new InvalidArgumentException("the prompt is empty; type some text first");
        IntList ctxP = new IntList();
        ctxP.addAll(targetCodec.startIds);
        ctxP.addAll(targetCodec.encode(prompt));
        int k = Math.max(cfg.draftLen > 0 ? cfg.draftLen : 8, cfg.lookupMaxTokens);
        int need = ctxP.size() + cfg.maxNewTokens + k + 1;
        if (need > target.maxSeqLen()) {
            throw new InvalidArgumentException("prompt (" + ctxP.size() + " target tokens) + " + cfg.maxNewTokens
                    + " new tokens + draft " + k + " needs " + need + " positions but the target holds " + target.maxSeqLen()
                    + "; shorten the prompt or lower max new tokens");
        }
        if (!DecodeConfig.TARGET_ONLY.equals(cfg.mode) && drafter == null) {
            throw new InvalidArgumentException("mode " + cfg.mode + " needs a drafter; load one or use target-only");
        }
        Run run = new Run(prompt, ctxP, cfg, rng, listener, trace);
        return DecodeConfig.TARGET_ONLY.equals(cfg.mode) ? run.targetOnly() : run.speculative();
    }

    private final class Run {
        final String prompt;
        final IntList ctxP;
        final int nPrompt;
        final DecodeConfig cfg;
        final boolean greedy;
        final Uniforms rng;
        final Listener listener;
        final List<Round> rounds;
        final DecodeStats stats = new DecodeStats();
        final ByteArrayOutputStream textOut = new ByteArrayOutputStream();
        int emitted;
        boolean done;

        Run(String prompt, IntList ctxP, DecodeConfig cfg, Uniforms rng, Listener listener, boolean trace) {
            this.prompt = prompt;
            this.ctxP = ctxP;
            this.nPrompt = ctxP.size();
            this.cfg = cfg;
            this.greedy = cfg.temperature == 0;
            this.rng = rng;
            this.listener = listener;
            this.rounds = trace ? new ArrayList<Round>() : null;
            target.reset();
        }

        float[][] callTarget(int[] tokens) {
            long t0 = System.nanoTime();
            float[][] rows = target.forward(tokens, target.cachedLen());
            stats.targetSeconds += (System.nanoTime() - t0) / 1e9;
            stats.steps++;
            return rows;
        }

        /** Feeds the target every prompt token but the last, timed apart (the same in every mode). */
        void prefill() {
            if (ctxP.size() > 1) {
                long t0 = System.nanoTime();
                target.forward(ctxP.slice(0, ctxP.size() - 1), 0);
                stats.prefillSeconds += (System.nanoTime() - t0) / 1e9;
            }
        }

        int pick(float[] logits) {
            return greedy ? Sampling.argmax(logits) : Sampling.draw(Sampling.softmax(logits, cfg.temperature, null), rng.next());
        }

        /** Appends target tokens, stopping at EOS or the token budget; streams the text. */
        int[] commit(int[] fresh) {
            int budget = cfg.maxNewTokens - (ctxP.size() - nPrompt);
            int[] add = Arrays.copyOf(fresh, Math.max(0, Math.min(fresh.length, budget)));
            for (int n = 0; n < add.length; n++) {
                if (eos.contains(add[n])) {
                    add = Arrays.copyOf(add, n + 1);
                    done = true;
                    break;
                }
            }
            ctxP.addAll(add);
            if (ctxP.size() - nPrompt >= cfg.maxNewTokens) done = true;
            for (int t : add) {
                if (eos.contains(t)) continue;
                byte[] b = targetCodec.tokenBytes(t);
                textOut.write(b, 0, b.length);
            }
            if (listener != null) {
                byte[] all = textOut.toByteArray();
                int end = all.length;
                while (end > 0 && !Utf8.isValid(all, 0, end)) end--; // hold back an unfinished character
                String text = Utf8.decodeLossy(all, 0, end);
                if (text.length() > emitted) {
                    listener.onText(text.substring(emitted));
                    emitted = text.length();
                }
            }
            return add;
        }

        Result result(long tStart) {
            stats.newTokens = ctxP.size() - nPrompt;
            stats.seconds = (System.nanoTime() - tStart) / 1e9;
            return new Result(Utf8.decodeLossy(textOut.toByteArray()), ctxP.slice(nPrompt, ctxP.size()), stats, rounds);
        }

        Result targetOnly() {
            long tStart = System.nanoTime();
            prefill();
            while (!done) {
                float[][] rows = callTarget(ctxP.slice(target.cachedLen(), ctxP.size()));
                commit(new int[] {pick(rows[rows.length - 1])});
                if (listener != null) listener.onRound(stats);
            }
            return result(tStart);
        }

        Result speculative() throws CoreException {
            NgramCache ngrams = DecodeConfig.NGRAM.equals(cfg.mode) ? cache : null;
            DrafterContext dctx = new DrafterContext(drafterCodec, prompt, cfg.lookbehind);
            if (dctx.size() >= drafter.maxSeqLen()) {
                throw new InvalidArgumentException("the prompt is " + dctx.size() + " drafter tokens but the drafter holds "
                        + drafter.maxSeqLen() + "; shorten the prompt");
            }
            drafter.reset();
            AutoDraftLength auto = cfg.draftLen == 0 ? new AutoDraftLength(4, 1, 8) : null;
            long tStart = System.nanoTime();
            prefill();
            int textPos = dctx.textLength();
            ContextIndex lookup = cfg.lookupMaxTokens > 0
                    ? new ContextIndex(cfg.lookupMaxTokens, cfg.lookupMinNgram, cfg.lookupMaxNgram, ctxP.toArray()) : null;
            while (!done) {
                // 0) Where the context repeats, copy what followed instead of drafting (q' = 1 per token).
                int room = Math.min(target.maxSeqLen() - ctxP.size(), cfg.maxNewTokens - (ctxP.size() - nPrompt)) - 1;
                int[] copied = lookup != null && room > 0 ? lookup.propose(room) : new int[0];
                boolean isCopy = copied.length > 0;
                // 1) Draft up to k tokens in the drafter's vocabulary (its KV cache holds idsQ[:cached]).
                boolean[] m0 = draftMask(cfg.mode);
                int[] idsQ = dctx.ids();
                int kWant = isCopy ? 0 : auto != null ? auto.current() : cfg.draftLen;
                int k = Math.min(kWant, drafter.maxSeqLen() - idsQ.length);
                int[] feed = Arrays.copyOfRange(idsQ, drafter.cachedLen(), idsQ.length);
                IntList draftL = new IntList();
                List<double[]> qRows = new ArrayList<double[]>();
                List<Double> uniforms = new ArrayList<Double>();
                long t0 = System.nanoTime();
                for (int s = 0; s < k; s++) {
                    float[][] out = drafter.forward(feed, drafter.cachedLen());
                    float[] logits = out[out.length - 1];
                    int d;
                    if (greedy) {
                        d = Sampling.maskedArgmax(logits, m0);
                    } else {
                        double[] q = Sampling.softmax(logits, cfg.temperature, m0);
                        double u = rng.next();
                        uniforms.add(u);
                        d = Sampling.draw(q, u);
                        qRows.add(q);
                    }
                    draftL.add(d);
                    feed = new int[] {d};
                }
                stats.drafterSeconds += (System.nanoTime() - t0) / 1e9;
                stats.drafterCalls += k;
                int[] draft = draftL.toArray();
                // 2) Translate to target tokens: cached n-grams (longest first), else the direct map.
                Translate.Translation tr = isCopy ? copiedTranslation(copied) : Translate.translate(draft, vocab, ngrams);
                int m = tr.size();
                // 3) Verify all m with one target call; rows[j] scores tr[j], rows[m] the bonus position.
                int nCtx = ctxP.size();
                IntList verify = IntList.of(ctxP.slice(target.cachedLen(), nCtx));
                verify.addAll(tr.targetIds);
                float[][] all = callTarget(verify.toArray());
                float[][] rows = Arrays.copyOfRange(all, all.length - (m + 1), all.length);
                // 4) Accept while the target agrees; then a correction (residual) or a bonus token.
                int j = 0;
                double[] p = null;
                while (j < m) {
                    int t = tr.targetIds.get(j);
                    boolean ok;
                    if (greedy) {
                        ok = Sampling.argmax(rows[j]) == t;
                    } else {
                        p = Sampling.softmax(rows[j], cfg.temperature, null);
                        double u = rng.next();
                        uniforms.add(u);
                        ok = rule.accept(u, isCopy ? 1.0 : rule.proposalProb(j, tr, draft, qRows, vocab), p[t]);
                    }
                    if (!ok) break;
                    j++;
                }
                int extra;
                if (j < m && !greedy) {
                    double[] dist = isCopy ? Sampling.residual(p, oneHot(tr.targetIds.get(j), p.length))
                            : rule.correction(p, j, tr, draft, qRows, vocab);
                    double u = rng.next();
                    uniforms.add(u);
                    extra = Sampling.draw(dist, u);
                } else {
                    extra = pick(rows[j]);
                }
                // 5) Roll the target back to the accepted prefix; `extra` is fed at the next call.
                target.rollback(nCtx + j);
                stats.proposed += m;
                stats.accepted += j;
                List<NgramCache.Key> hits = new ArrayList<NgramCache.Key>();
                for (int i = 0; i < j; i++) if (tr.keys.get(i) != null) hits.add(tr.keys.get(i));
                for (NgramCache.Key key : tr.keys) if (key != null) stats.ngramProposed++;
                stats.ngramHits += hits.size();
                int[] accepted = new int[j + 1];
                for (int i = 0; i < j; i++) accepted[i] = tr.targetIds.get(i);
                accepted[j] = extra;
                int[] fresh = commit(accepted);
                if (lookup != null) lookup.extend(fresh);
                if (isCopy) {
                    stats.lookupRounds++;
                    stats.lookupProposed += m;
                    stats.lookupAccepted += j;
                } else if (auto != null) {
                    auto.update(m, j);
                }
                // 6) Reverse translation: re-tokenize the accepted text for the drafter, harvest n-grams.
                List<int[]> spans = new ArrayList<int[]>();
                ByteArrayOutputStream joined = new ByteArrayOutputStream();
                for (int t : fresh) {
                    byte[] b = targetCodec.tokenBytes(t);
                    spans.add(new int[] {t, textPos, textPos + b.length});
                    textPos += b.length;
                    joined.write(b, 0, b.length);
                }
                List<int[]> window = dctx.append(joined.toByteArray());
                int added = 0;
                if (ngrams != null) {
                    for (NgramCache.Key key : hits) ngrams.recordHit(key);
                    added = Translate.harvestNgrams(window, spans, vocab, ngrams);
                    stats.ngramAdded += added;
                }
                // Crop the drafter's cache to the common prefix of what it saw and the new context.
                int[] now = dctx.ids();
                int seenLen = idsQ.length + Math.max(0, draft.length - 1);
                int lcp = 0;
                int limit = Math.min(drafter.cachedLen(), now.length - 1);
                while (lcp < limit && lcp < seenLen
                        && (lcp < idsQ.length ? idsQ[lcp] : draft[lcp - idsQ.length]) == now[lcp]) {
                    lcp++;
                }
                drafter.rollback(lcp);
                if (rounds != null) {
                    Round r = new Round();
                    r.draft = draft;
                    r.context = idsQ;
                    r.targetIds = tr.targetIds.toArray();
                    r.spans = tr.spans.toArray(new int[0][]);
                    r.merged = new boolean[m];
                    for (int i = 0; i < m; i++) r.merged[i] = tr.keys.get(i) != null;
                    r.accepted = j;
                    r.extra = extra;
                    r.committed = fresh;
                    r.uniforms = new double[uniforms.size()];
                    for (int i = 0; i < r.uniforms.length; i++) r.uniforms[i] = uniforms.get(i);
                    r.ngramAdded = added;
                    r.drafterCacheKept = lcp;
                    rounds.add(r);
                }
                if (listener != null) listener.onRound(stats);
            }
            return result(tStart);
        }
    }

    private static Translate.Translation copiedTranslation(int[] copied) {
        Translate.Translation tr = new Translate.Translation();
        for (int t : copied) {
            tr.targetIds.add(t);
            tr.spans.add(new int[] {0, 0});
            tr.keys.add(null);
        }
        return tr;
    }

    private static double[] oneHot(int t, int n) {
        double[] q = new double[n];
        q[t] = 1.0;
        return q;
    }
}
