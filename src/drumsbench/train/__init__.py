"""``drumsbench train``: a small GRPO-style policy-gradient loop through the real rollout engine.

Modules: ``action_space`` (the discrete actions built from each coding task), ``fault_model``
(action-/task-correlated or uniform real faults, drawn identically for every treatment),
``policy_net`` (the PyTorch network and the rollout ``Policy`` that samples from it),
``treatments`` (what each treatment does with an invalid attempt), ``grpo`` (group advantages and
the clipped update), ``experiment`` (the loop, ledger writes), ``rebuild`` (the report from the
ledger alone) and ``artifact`` (the typed report). torch is imported only by ``policy_net`` and
``grpo``, and only when training runs (``pip install drumsbench[train]``).
"""
