package org.omnidraft.specdecode;

import java.util.List;
import org.junit.Test;

/**
 * Mutation checks: the sampling runs of the loop vectors must fail to replay when the acceptance
 * rule is deliberately wrong. (If the real rule in SpeculativeDecoder were broken the same way,
 * LoopVectorTest's sampling tests would fail exactly like these replays.) The Eq. 2 prefix
 * correction is pinned by TranslateVectorTest.eq2PrefixCorrectionMatchesPython. The last two tests
 * do the same on the bundled pair's vectors (real logits, top entries), so the real-pair replay is
 * shown to be sensitive to the rule too, not only the scripted one.
 */
public class AcceptanceRuleTest {
    /** Accepts with probability min(1, p) instead of min(1, p/q'). */
    @Test
    public void ignoringTheProposalProbabilityIsCaught() throws Exception {
        LoopVectorTest.expectFailure(new SpeculativeDecoder.AcceptanceRule() {
            @Override
            public boolean accept(double u, double qPrime, double p) {
                return u < p;
            }

            @Override
            public double[] correction(double[] p, int j, Translate.Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab) {
                return SpeculativeDecoder.STANDARD_RULE.correction(p, j, tr, draft, qRows, vocab);
            }
        });
    }

    /** Accepts with min(1, q'/p): the ratio upside down. */
    @Test
    public void invertedRatioIsCaught() throws Exception {
        LoopVectorTest.expectFailure(new SpeculativeDecoder.AcceptanceRule() {
            @Override
            public boolean accept(double u, double qPrime, double p) {
                return u * p < qPrime;
            }

            @Override
            public double[] correction(double[] p, int j, Translate.Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab) {
                return SpeculativeDecoder.STANDARD_RULE.correction(p, j, tr, draft, qRows, vocab);
            }
        });
    }

    /** Draws the correction from p instead of the residual norm(max(0, p - q')). */
    @Test
    public void correctionFromTargetInsteadOfResidualIsCaught() throws Exception {
        LoopVectorTest.expectFailure(new SpeculativeDecoder.AcceptanceRule() {
            @Override
            public boolean accept(double u, double qPrime, double p) {
                return u * qPrime < p;
            }

            @Override
            public double[] correction(double[] p, int j, Translate.Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab) {
                return p;
            }
        });
    }

    /** Accepts when u * q' >= p: the comparison flipped. Must fail the bundled-pair replay. */
    @Test
    public void flippedComparisonFailsTheBundledPairReplay() throws Exception {
        LoopVectorTest.expectFailure(LoopVectorTest.PAIR, new SpeculativeDecoder.AcceptanceRule() {
            @Override
            public boolean accept(double u, double qPrime, double p) {
                return u * qPrime >= p;
            }

            @Override
            public double[] correction(double[] p, int j, Translate.Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab) {
                return SpeculativeDecoder.STANDARD_RULE.correction(p, j, tr, draft, qRows, vocab);
            }
        });
    }

    /**
     * Takes a merged n-gram's q' as q of its first sub-token, ignoring the product over its
     * sub-tokens (Eq. 1). Must fail the scripted replay. The bundled pair's sampling runs cannot
     * show it: every cached n-gram they test is the one-token entry (byte-fallback "<0x0A>") -> "\n",
     * whose product has a single factor.
     */
    @Test
    public void ignoringTheMergedTokenProductIsCaught() throws Exception {
        SpeculativeDecoder.AcceptanceRule noProduct = new SpeculativeDecoder.AcceptanceRule() {
            @Override
            public boolean accept(double u, double qPrime, double p) {
                return u * qPrime < p;
            }

            @Override
            public double proposalProb(int j, Translate.Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab) {
                int i0 = tr.spans.get(j)[0];
                return qRows.get(i0)[draft[i0]];
            }

            @Override
            public double[] correction(double[] p, int j, Translate.Translation tr, int[] draft, List<double[]> qRows, VocabMap vocab) {
                return SpeculativeDecoder.STANDARD_RULE.correction(p, j, tr, draft, qRows, vocab);
            }
        };
        LoopVectorTest.expectFailure(LoopVectorTest.SCRIPTED, noProduct);
    }
}
