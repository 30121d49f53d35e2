"""Fleet learning: many devices' drafter adapters averaged on Flower, so a new device starts from
what the fleet learned without anyone's text leaving a device.

Each round the server (``server.py``, a Flower ServerApp) sends the global LoRA adapter of one
(drafter, target) pair, with the pair's identity, to every device. A device (``client.py``, a
Flower ClientApp) runs the online adaptation pass of ``omnidraft.adapt`` on the next prompts of its
own stream (hybrid loss, LoRA gradients from the ExecuTorch training program, drift guard on) and
replies with its adapter and the number of verified target tokens it learned from. The server
refuses deltas of another pair, of another layout and with NaN values (one line each, the last good
adapter stays), drops poisoned deltas (``strategy.py``: each delta scored alone on a server-side
probe set, or Multi-Krum), averages the rest weighted by verified tokens (Flower's FedAvg
convention, ``num-examples``), checks the average on the probe prompts as a device's drift guard
checks its own update (an aggregate is published only if it beats the published adapter there),
publishes the result as a new version (``store.py``: atomic, resumable after a restart), folds it
into the global drafter and optionally re-lowers it with ``omnidraft export``.

**A and B are averaged separately.** The merged update of a layer is s·B·A, and the mean of B_i·A_i
is not mean(B)·mean(A): the exact mean of N rank-r updates has rank up to N·r and no longer fits the
adapter. We average the factors because (1) every device starts a round from the same global A, and
in a round of a few steps A moves little (B starts at zero, so the first step moves only B), which
keeps mean(B)·mean(A) close to mean(B_i·A_i); (2) the result stays a rank-r PEFT adapter, so a
device downloads exactly what it uploads (1.19 MB at rank 8 on the bundled pair) and ``omnidraft
adapt`` reads it; (3) measured: the server computes both every round (``ab_vs_merged`` in
fleet.json). On the bundled pair, 8 devices, 5 rounds, the factors' average lay 3-8 % (relative
Frobenius distance) from the exact mean of the merged updates, and its teacher-forced agreement
with the target on the probe set equalled the exact mean's in 4 rounds and exceeded it by 0.007 in
one (0.845 vs 0.838).

Modules: ``config`` (the run as nested data, sent to devices in each message), ``data`` (non-IID
shards, held-out and probe prompts), ``learner`` (the pass and the measurements), ``aggregate``
(tensor arithmetic, no Flower), ``strategy`` (FedAvg subclass with the checks), ``server`` /
``client`` (the Flower apps), ``simulate`` (Flower's simulation engine), ``deploy`` (SuperLink and
SuperNodes), ``report`` (fleet.json, fleet.md, fleet.png).
"""
