// Versions are pinned on purpose; see README.md ("Versions") for where each was checked.
plugins {
    id("com.android.application") version "9.3.0" apply false
}
