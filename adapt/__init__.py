"""Online adaptation of the drafter (paper §3, Algorithm 2).

The speculative loop's verification passes feed an on-policy buffer (``buffer``); every I prompts the
drafter takes an AdamW step on the hybrid loss (``loss``) with gradients from ExecuTorch's training
runtime (``etprogram``) or torch eager (``trainer``); LoRA deltas are saved per target in PEFT layout and
merged back into a drafter folder, guarded against drift (``delta``, ``guard``, ``online``).
"""
