"""How each failure class plays out: who fails (one rank, every rank, nobody visible), whether the job
goes on."""

from __future__ import annotations

from typing import Literal

Mode = Literal["crash", "hang", "all", "continue", "victims"]

DEMO_CLASS = "gpu_hardware_error"
DEMO_RANK = 37
DEMO_XID_TEXT = "NVRM: Xid (PCI:0000:{bus}:00): 79, pid={pid}, GPU has fallen off the bus."

# Deterministic data/config errors: every rank loads the same bad file or config and fails the same way.
ALL_RANK_CLASSES = frozenset(
    {
        "checkpoint_corruption",
        "unpickling_truncated",
        "torch_load_failed",
        "weights_only_unpickling_error",
        "checkpoint_version_incompatible",
        "safetensors_load_error",
        "model_state_dict_mismatch",
        "optimizer_state_dict_mismatch",
        "optimizer_state_resize_failure",
        "tensorrt_llm_weight_mapper",
        "dataset_license_issue",
        "launch_config_error",
    }
)
# The job keeps running after the event (a numeric anomaly, a detector's warning).
CONTINUE_CLASSES = frozenset(
    {"sdc_grad_norm_spike", "sdc_parameter_drift", "sdc_gemm_mismatch", "nccl_reduce_scatter_sdc", "loss_nan", "pii_leakage"}
)
# Consequences only: every rank shows the class and nothing in the logs says who started it.
VICTIM_CLASSES = frozenset({"nccl_timeout", "launcher_teardown"})
# The initiating rank stops making progress without an error line of its own.
HANG_CLASSES = frozenset({"straggler_hang"})


def mode_of(cls: str) -> Mode:
    return (
        "all" if cls in ALL_RANK_CLASSES
        else "victims" if cls in VICTIM_CLASSES
        else "continue" if cls in CONTINUE_CLASSES
        else "hang" if cls in HANG_CLASSES
        else "crash"
    )  # fmt: skip
