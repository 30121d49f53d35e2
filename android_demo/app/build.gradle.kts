plugins {
    id("com.android.application")
}

android {
    namespace = "org.omnidraft.demo"
    compileSdk = 36

    defaultConfig {
        applicationId = "org.omnidraft.demo"
        minSdk = 26
        targetSdk = 36
        versionCode = 1
        versionName = "0.1.0"
        ndk {
            // The executorch-android AAR ships these two ABIs.
            abiFilters += listOf("arm64-v8a", "x86_64")
        }
    }

    buildTypes {
        release {
            isMinifyEnabled = false
        }
    }

    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_11
        targetCompatibility = JavaVersion.VERSION_11
    }
}

dependencies {
    implementation(project(":specdecode-core"))
    // Same ExecuTorch release as the Python exporter (executorch==1.5.1), so the .pte files load.
    implementation("org.pytorch:executorch-android:1.5.1")
    // A drafter compiled for the Hexagon NPU (omnidraft export --device qnn-htp) runs on ONNX Runtime's
    // QNN provider, whose Java API (SessionOptions.addQnn) this AAR carries with its HTP libraries.
    // Not built here (no Maven access): its QNN libraries must be at least as new as the QAIRT
    // version the export's manifest names, or the provider refuses the context binary at load.
    implementation("com.microsoft.onnxruntime:onnxruntime-android-qnn:1.29.0")
}
