package org.omnidraft.demo;

import android.app.Activity;
import android.os.Bundle;
import android.os.Handler;
import android.os.Looper;
import android.text.InputType;
import android.util.Log;
import android.view.View;
import android.view.ViewGroup;
import android.widget.AdapterView;
import android.widget.ArrayAdapter;
import android.widget.Button;
import android.widget.EditText;
import android.widget.LinearLayout;
import android.widget.ScrollView;
import android.widget.Spinner;
import android.widget.TextView;
import java.io.File;
import java.io.IOException;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CancellationException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.omnidraft.specdecode.CoreException;
import org.omnidraft.specdecode.DecodeConfig;
import org.omnidraft.specdecode.DecodeStats;
import org.omnidraft.specdecode.SpeculativeDecoder;
import org.omnidraft.specdecode.Uniforms;

/**
 * Drafter picker (each pushed drafter export with where it runs: CPU, an ExecuTorch delegate, the
 * Hexagon NPU), prompt box, streamed output, live acceptance / tokens per second / cache size,
 * settings for K (or auto) and temperature. Loading and decoding run on one worker thread; the UI thread only
 * posts results. The n-gram cache is saved when the activity pauses.
 */
public class MainActivity extends Activity {
    private static final String TAG = "omnidraft";
    private static final String[] K_CHOICES = {"auto", "1", "2", "3", "4", "5", "6", "8"};

    private final ExecutorService worker = Executors.newSingleThreadExecutor();
    private final Handler ui = new Handler(Looper.getMainLooper());
    private volatile boolean cancel;
    private Engine engine; // touched on the worker thread only

    private EditText prompt, temperature, maxTokens;
    private Spinner kChoice, drafterChoice;
    private Button run, stop;
    private TextView output, stats, status, runsOn;

    @Override
    protected void onCreate(Bundle state) {
        super.onCreate(state);
        setContentView(buildUi());
        status.setText("Looking for models in " + ModelFiles.DEVICE_ROOT + " ...");
        run.setEnabled(false);
        worker.execute(new Runnable() {
            @Override
            public void run() {
                try {
                    final List<Drafters.Option> options = Drafters.find(new File(ModelFiles.DEVICE_ROOT));
                    post(new Runnable() {
                        @Override
                        public void run() {
                            offerDrafters(options);
                        }
                    });
                } catch (final CoreException e) {
                    showError(e.getMessage());
                } catch (final RuntimeException e) { // ExecuTorch reports native failures as runtime exceptions
                    Log.e(TAG, "listing drafters failed", e);
                    showError("Could not read the drafter exports: " + e.getMessage());
                }
            }
        });
    }

    /** The drafter picker: every pushed drafter export with where it runs; the first runnable one loads. */
    private void offerDrafters(final List<Drafters.Option> options) {
        drafterChoice.setAdapter(new ArrayAdapter<Drafters.Option>(this, android.R.layout.simple_spinner_dropdown_item, options));
        int first = 0;
        while (first < options.size() - 1 && options.get(first).choice.unavailable != null) first++;
        drafterChoice.setSelection(first);
        drafterChoice.setOnItemSelectedListener(new AdapterView.OnItemSelectedListener() {
            @Override
            public void onItemSelected(AdapterView<?> parent, View view, int position, long id) {
                load(options.get(position));
            }

            @Override
            public void onNothingSelected(AdapterView<?> parent) {}
        });
    }

    private void load(final Drafters.Option drafter) {
        run.setEnabled(false);
        status.setText("Loading " + drafter.dir.getName() + " (" + drafter.choice.label + ") and the target ...");
        worker.execute(new Runnable() {
            @Override
            public void run() {
                try {
                    if (engine != null) {
                        engine.saveCache();
                        engine.close();
                        engine = null;
                    }
                    engine = Engine.load(new File(ModelFiles.DEVICE_ROOT), new File(getFilesDir(), "ngram-cache.json"), drafter);
                    final int entries = engine.cache.size();
                    final String where = engine.drafterRunsOn;
                    post(new Runnable() {
                        @Override
                        public void run() {
                            runsOn.setText("drafter runs on: " + where);
                            status.setText("Ready. n-gram cache: " + entries + " entries.");
                            run.setEnabled(true);
                        }
                    });
                } catch (final CoreException e) {
                    showError(e.getMessage());
                } catch (final IOException e) {
                    showError("Saving the n-gram cache failed: " + e.getMessage());
                } catch (final RuntimeException e) { // ExecuTorch reports load failures as runtime exceptions
                    Log.e(TAG, "load failed", e);
                    showError("Could not load the models: " + e.getMessage());
                }
            }
        });
    }

    private View buildUi() {
        LinearLayout root = new LinearLayout(this);
        root.setOrientation(LinearLayout.VERTICAL);
        int pad = (int) (12 * getResources().getDisplayMetrics().density);
        root.setPadding(pad, pad, pad, pad);
        prompt = new EditText(this);
        prompt.setHint("Prompt");
        prompt.setMinLines(3);
        root.addView(prompt, new LinearLayout.LayoutParams(ViewGroup.LayoutParams.MATCH_PARENT, ViewGroup.LayoutParams.WRAP_CONTENT));

        drafterChoice = new Spinner(this);
        root.addView(drafterChoice);
        runsOn = new TextView(this);
        root.addView(runsOn);

        LinearLayout settings = new LinearLayout(this);
        settings.setOrientation(LinearLayout.HORIZONTAL);
        TextView kLabel = new TextView(this);
        kLabel.setText("K ");
        settings.addView(kLabel);
        kChoice = new Spinner(this);
        kChoice.setAdapter(new ArrayAdapter<String>(this, android.R.layout.simple_spinner_dropdown_item, K_CHOICES));
        kChoice.setSelection(0);
        settings.addView(kChoice);
        temperature = numberField("0.0", "temperature", true);
        settings.addView(temperature);
        maxTokens = numberField("128", "max new tokens", false);
        settings.addView(maxTokens);
        root.addView(settings);

        LinearLayout buttons = new LinearLayout(this);
        run = new Button(this);
        run.setText("Generate");
        run.setOnClickListener(new View.OnClickListener() {
            @Override
            public void onClick(View v) {
                startGeneration();
            }
        });
        stop = new Button(this);
        stop.setText("Stop");
        stop.setEnabled(false);
        stop.setOnClickListener(new View.OnClickListener() {
            @Override
            public void onClick(View v) {
                cancel = true;
            }
        });
        buttons.addView(run);
        buttons.addView(stop);
        root.addView(buttons);

        stats = new TextView(this);
        stats.setTypeface(android.graphics.Typeface.MONOSPACE);
        root.addView(stats);
        status = new TextView(this);
        root.addView(status);
        ScrollView scroll = new ScrollView(this);
        output = new TextView(this);
        output.setTextIsSelectable(true);
        scroll.addView(output);
        root.addView(scroll, new LinearLayout.LayoutParams(ViewGroup.LayoutParams.MATCH_PARENT, 0, 1f));
        return root;
    }

    private EditText numberField(String value, String hint, boolean decimal) {
        EditText e = new EditText(this);
        e.setText(value);
        e.setHint(hint);
        e.setInputType(InputType.TYPE_CLASS_NUMBER | (decimal ? InputType.TYPE_NUMBER_FLAG_DECIMAL : 0));
        e.setMinEms(4);
        return e;
    }

    private void startGeneration() {
        final DecodeConfig cfg = new DecodeConfig();
        try {
            String k = (String) kChoice.getSelectedItem();
            cfg.draftLen = "auto".equals(k) ? 0 : Integer.parseInt(k);
            cfg.temperature = Double.parseDouble(temperature.getText().toString().trim());
            cfg.maxNewTokens = Integer.parseInt(maxTokens.getText().toString().trim());
            cfg.lookupMaxTokens = 6; // copy drafts where the context repeats, as the desktop runtime does
            cfg.validate();
        } catch (NumberFormatException e) {
            status.setText("Temperature and max new tokens must be numbers.");
            return;
        } catch (CoreException e) {
            status.setText(e.getMessage());
            return;
        }
        final String text = prompt.getText().toString();
        output.setText("");
        status.setText("Generating ...");
        run.setEnabled(false);
        stop.setEnabled(true);
        cancel = false;
        worker.execute(new Runnable() {
            @Override
            public void run() {
                String end;
                try {
                    SpeculativeDecoder.Result r = engine.decoder.generate(text, cfg, Uniforms.seeded(System.nanoTime()),
                            new SpeculativeDecoder.Listener() {
                                @Override
                                public void onText(final String delta) {
                                    post(new Runnable() {
                                        @Override
                                        public void run() {
                                            output.append(delta);
                                        }
                                    });
                                }

                                @Override
                                public void onRound(DecodeStats s) {
                                    final String line = statsLine(s, engine.cache.size());
                                    post(new Runnable() {
                                        @Override
                                        public void run() {
                                            stats.setText(line);
                                        }
                                    });
                                    if (cancel) throw new CancellationException();
                                }
                            }, false);
                    final String line = statsLine(r.stats, engine.cache.size());
                    post(new Runnable() {
                        @Override
                        public void run() {
                            stats.setText(line);
                        }
                    });
                    end = "Done.";
                } catch (CancellationException e) {
                    end = "Stopped.";
                } catch (CoreException e) {
                    end = e.getMessage();
                } catch (RuntimeException e) {
                    Log.e(TAG, "generation failed", e);
                    end = "Generation failed: " + e.getMessage();
                }
                final String msg = end;
                post(new Runnable() {
                    @Override
                    public void run() {
                        status.setText(msg);
                        run.setEnabled(true);
                        stop.setEnabled(false);
                    }
                });
            }
        });
    }

    /** Live: tokens so far over model time; at the end: new tokens over wall time. */
    static String statsLine(DecodeStats s, int cacheEntries) {
        boolean finished = s.seconds > 0;
        int tokens = finished ? s.newTokens : s.accepted + s.steps; // each round commits accepted + 1
        double time = finished ? s.seconds : s.drafterSeconds + s.targetSeconds;
        return String.format(Locale.US, "acceptance %.2f  |  %.1f tok/s  |  %.2f tok/step  |  cache %d (hits %d)",
                s.acceptanceRate(), time > 0 ? tokens / time : 0.0, s.steps > 0 ? (double) tokens / s.steps : 0.0,
                cacheEntries, s.ngramHits);
    }

    private void post(Runnable r) {
        ui.post(r);
    }

    private void showError(final String message) {
        post(new Runnable() {
            @Override
            public void run() {
                status.setText(message);
                output.setText(message);
                run.setEnabled(false);
            }
        });
    }

    @Override
    protected void onPause() {
        super.onPause();
        cancel = true; // stop a running generation so the save below runs promptly
        worker.execute(new Runnable() {
            @Override
            public void run() {
                if (engine == null) return;
                try {
                    engine.saveCache();
                } catch (IOException e) {
                    Log.e(TAG, "saving the n-gram cache failed", e);
                }
            }
        });
    }

    @Override
    protected void onDestroy() {
        super.onDestroy();
        worker.execute(new Runnable() {
            @Override
            public void run() {
                if (engine != null) engine.close();
            }
        });
        worker.shutdown();
    }
}
