"""Fleet learning: many devices' drafter adapters averaged on Flower, so a new device starts from
what the fleet learned without anyone's text leaving a device.

Each round the server (``server.py``, a Flower ServerApp) sends the global LoRA adapter of one
(drafter, target) pair, with the pair's identity, to every device. A device (``client.py``, a
Flower ClientApp) runs the online adaptation pass of ``omnidraft.adapt`` on the next prompts of its
own stream (hybrid loss, LoRA gradients from the ExecuTorch training program, drift guard on) and
replies with its adapter and the number of verified target tokens it learned from. The server
refuses deltas of another pair, of another layout and with NaN values (one line each, the last good
adapter stays), drops poisoned deltas (``strategy.py``: leave-one-out on a server-side probe set, or
Multi-Krum), averages the rest weighted by verified tokens (Flower's FedAvg convention,
``num-examples``), publishes the result as a new version (``store.py``: atomic, resumable after a
restart), folds it into the global drafter and optionally re-lowers it with ``omnidraft export``.

**A and B are averaged separately.** The merged update of a layer is s·B·A, and the mean of B_i·A_i
is not mean(B)·mean(A): the exact mean of N rank-r updates has rank up to N·r and no longer fits the
adapter. We average the factors because (1) every device starts a round from the same global A, and
in a round of a few steps A moves little (B starts at zero, so the first step moves only B), which
keeps mean(B)·mean(A) close to mean(B_i·A_i); (2) the result stays a rank-r PEFT adapter, so a
device downloads exactly what it uploads (1.19 MB at rank 8 on the bundled pair) and ``omnidraft
adapt`` reads it; (3) measured: the server computes both every round (``ab_vs_merged`` in
fleet.json). On the bundled pair, 8 devices, the factors' average lies 8-12 % (relative Frobenius
distance) from the exact mean of the merged updates, and its teacher-forced agreement with the
target on the probe set was within 0.02 of the exact mean's (0.802 vs 0.779 after round 1, 0.814
vs 0.826 after round 2), once above and once below.

Modules: ``config`` (the run as nested data, sent to devices in each message), ``data`` (non-IID
shards, held-out and probe prompts), ``learner`` (the pass and the measurements), ``aggregate``
(tensor arithmetic, no Flower), ``strategy`` (FedAvg subclass with the checks), ``server`` /
``client`` (the Flower apps), ``simulate`` (Flower's simulation engine), ``deploy`` (SuperLink and
SuperNodes), ``report`` (fleet.json, fleet.md, fleet.png).
"""
