// Pure Java 8 library: no Android, no third-party runtime dependencies. CI builds and tests it
// without Gradle (ci/test_core.sh); this file lets Android Studio build and test it too.
plugins {
    `java-library`
}

java {
    sourceCompatibility = JavaVersion.VERSION_1_8
    targetCompatibility = JavaVersion.VERSION_1_8
}

tasks.withType<JavaCompile>().configureEach {
    options.encoding = "UTF-8"
    options.release.set(8)
}

dependencies {
    testImplementation("junit:junit:4.13.2")
}

tasks.test {
    // Tokenizers for the vector tests: the Llama-2 one is converted into the user's cache
    // (python -m omnidraft.models.gguf_tokenizers llama-spm), GPT-2 is committed in the repo.
    val cache = System.getenv("OMNIDRAFT_CACHE") ?: "${System.getProperty("user.home")}/.cache/omnidraft"
    systemProperty("omnidraft.tokenizer.llama-spm",
        System.getenv("OMNIDRAFT_LLAMA_SPM_TOKENIZER") ?: "$cache/tokenizers/llama-spm/tokenizer.json")
    systemProperty("omnidraft.tokenizer.gpt-2", rootDir.resolve("../models/tokenizers/gpt2/tokenizer.json").absolutePath)
}
