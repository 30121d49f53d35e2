"""Test fixtures for the Android project's pure-Java core (``specdecode-core``): tokenizer, loop and
bundled-pair vectors that the Java tests replay exactly. Written by ``omnidraft android-vectors``."""
