package org.omnidraft.specdecode;

import java.util.ArrayList;
import java.util.List;
import org.junit.runner.Description;
import org.junit.runner.JUnitCore;
import org.junit.runner.Result;
import org.junit.runner.notification.Failure;
import org.junit.runner.notification.RunListener;

/**
 * Runs the given JUnit 4 classes and ends with the line {@code N passed, N failed} that CI reads;
 * exits 1 when anything failed (ci/test_core.sh calls it with every *Test class it compiled).
 */
public final class CoreTestMain {
    private CoreTestMain() {}

    public static void main(String[] args) throws Exception {
        List<Class<?>> classes = new ArrayList<Class<?>>();
        for (String name : args) classes.add(Class.forName(name));
        JUnitCore core = new JUnitCore();
        core.addListener(new RunListener() {
            @Override
            public void testFailure(Failure f) {
                String msg = String.valueOf(f.getMessage());
                if (msg.length() > 2000) msg = msg.substring(0, 2000) + "...";
                System.out.println("FAIL " + f.getDescription().getDisplayName() + ": " + msg);
                if (f.getException() != null && !(f.getException() instanceof AssertionError)) {
                    f.getException().printStackTrace(System.out);
                }
            }

            @Override
            public void testFinished(Description d) {
                System.out.println("ran  " + d.getDisplayName());
            }
        });
        Result r = core.run(classes.toArray(new Class<?>[0]));
        int failed = r.getFailureCount();
        int passed = r.getRunCount() - failed;
        System.out.println(passed + " passed, " + failed + " failed");
        System.exit(failed == 0 && r.getRunCount() > 0 ? 0 : 1);
    }
}
